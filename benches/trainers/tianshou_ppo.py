"""tianshou's PPO as its documentation builds it (`PPO(...).run_training(OnPolicyTrainerParams(...))` over a
`Collector`), unedited, on Gymnasium's CartPole-v1 in a `DummyVectorEnv` (or `SubprocVectorEnv`) of `--n-envs`
copies, no test collection: the command `rlperf attach` and the benches measure. Prints the trainer's own count of
agent steps (its `train_step`, the env steps it collected) and the seconds training took, as JSON: the count attach
must match, and the speed its cost is measured by."""

from __future__ import annotations

from benches.trainers.driver import ppo_parser, report, timed_training


def main() -> None:
    parser = ppo_parser(__doc__)
    parser.add_argument("--vector", choices=("dummy", "subproc"), default="dummy")
    args = parser.parse_args()

    import gymnasium as gym
    import torch
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv, SubprocVectorEnv
    from tianshou.trainer import OnPolicyTrainerParams
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vector = DummyVectorEnv if args.vector == "dummy" else SubprocVectorEnv
    envs = vector([lambda: gym.make("CartPole-v1") for _ in range(args.n_envs)])
    envs.seed(args.seed)
    space = gym.make("CartPole-v1")
    hidden = [args.net, args.net]
    state_shape, action_shape = space.observation_space.shape, space.action_space.n
    actor = DiscreteActor(preprocess_net=Net(state_shape=state_shape, hidden_sizes=hidden, activation=torch.nn.Tanh),
                          action_shape=action_shape, softmax_output=False).to(args.device)
    critic = DiscreteCritic(preprocess_net=Net(state_shape=state_shape, hidden_sizes=hidden,
                                               activation=torch.nn.Tanh)).to(args.device)
    policy = DiscreteActorPolicy(actor=actor, action_space=space.action_space)
    algorithm = PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=3e-4), max_batchsize=4096)
    rollout = args.n_envs * args.n_steps
    collector = Collector(algorithm, envs, VectorReplayBuffer(rollout, args.n_envs))
    params = OnPolicyTrainerParams(
        training_collector=collector, max_epochs=1, epoch_num_steps=rollout * args.updates,
        collection_step_num_env_steps=rollout, batch_size=args.batch_size,
        update_step_num_repetitions=args.n_epochs, verbose=False, show_progress=False, logger=None)
    with timed_training() as seconds:
        result = algorithm.run_training(params)
    envs.close()
    report("train_step", result.train_step, seconds)


if __name__ == "__main__":
    main()
