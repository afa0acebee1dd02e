"""TorchRL's PPO as its package ships it (`torchrl.trainers.algorithms.PPOTrainer` over a `Collector`,
`ClipPPOLoss` and GAE), unedited, on Gymnasium's CartPole-v1, `--n-envs` copies in TorchRL's `SerialEnv` (its
batched env stepping each copy in this process):
the command `rlperf attach` and the benches measure. Prints the trainer's own count of frames (agent steps,
`collected_frames`) and the seconds its `train` took last, as JSON: the count attach must match, and the speed
its cost is measured by."""

from __future__ import annotations

import warnings

from benches.trainers.driver import ppo_parser, report, timed_training


def main() -> None:
    parser = ppo_parser(__doc__, device=False)
    args = parser.parse_args()

    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
    from torchrl.envs import GymEnv, SerialEnv
    from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.trainers.algorithms import PPOTrainer

    warnings.filterwarnings("ignore", category=UserWarning)  # PPOTrainer says it is a prototype, every run
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    env = SerialEnv(args.n_envs, lambda: GymEnv("CartPole-v1"))
    env.set_seed(args.seed)
    actions, observations = env.action_spec.shape[-1], env.observation_spec["observation"].shape[-1]
    hidden = [args.net, args.net]
    actor = ProbabilisticActor(
        TensorDictModule(MLP(in_features=observations, out_features=actions, num_cells=hidden, activation_class=torch.nn.Tanh),
                         in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], spec=env.action_spec, distribution_class=torch.distributions.OneHotCategorical,
        return_log_prob=True)
    critic = ValueOperator(MLP(in_features=observations, out_features=1, num_cells=hidden, activation_class=torch.nn.Tanh),
                           in_keys=["observation"])
    frames_per_batch = args.n_envs * args.n_steps
    total_frames = frames_per_batch * args.updates
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=total_frames)
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0)
    buffer = ReplayBuffer(storage=LazyTensorStorage(frames_per_batch), sampler=SamplerWithoutReplacement(),
                          batch_size=args.batch_size)
    trainer = PPOTrainer(collector=collector, total_frames=total_frames, frame_skip=1,
                         optim_steps_per_batch=frames_per_batch // args.batch_size, loss_module=loss,
                         optimizer=torch.optim.Adam(loss.parameters(), lr=3e-4), replay_buffer=buffer,
                         num_epochs=args.n_epochs, progress_bar=False, enable_logging=False, log_rewards=False,
                         log_actions=False, save_trainer_file=None)
    with timed_training() as seconds:
        trainer.train()
    collector.shutdown()
    report("collected_frames", trainer.collected_frames, seconds)


if __name__ == "__main__":
    main()
