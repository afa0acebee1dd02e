"""stable-baselines3's PPO as its users run it (`PPO("MlpPolicy", env).learn(...)`), unedited, on CartPole-v1
in a DummyVecEnv of `--n-envs` copies: the command `rlperf attach` and the benches measure. Prints the trainer's
own count of agent steps (`num_timesteps`) and the seconds `learn` took last, as JSON: the count attach must
match, and the speed its cost is measured by."""

from __future__ import annotations

from benches.trainers.driver import ppo_parser, report, timed_training


def main() -> None:
    parser = ppo_parser(__doc__)
    args = parser.parse_args()

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.threads)
    env = make_vec_env("CartPole-v1", n_envs=args.n_envs, seed=args.seed)
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
                policy_kwargs={"net_arch": [args.net, args.net]}, device=args.device, seed=args.seed, verbose=0)
    with timed_training() as seconds:
        model.learn(total_timesteps=args.updates * args.n_steps * args.n_envs)
    report("num_timesteps", model.num_timesteps, seconds)


if __name__ == "__main__":
    main()
