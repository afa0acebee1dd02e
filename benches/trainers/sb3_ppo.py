"""stable-baselines3's PPO as its users run it (`PPO("MlpPolicy", env).learn(...)`), unedited, on CartPole-v1
in a DummyVecEnv of `--n-envs` copies: the command `rlperf attach` and the benches measure. Prints the trainer's
own count of agent steps (`num_timesteps`) and the seconds `learn` took last, as JSON: the count attach must
match, and the speed its cost is measured by."""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=128, help="env steps per rollout, per env")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-epochs", type=int, default=4)
    parser.add_argument("--updates", type=int, default=6, help="rollouts, each followed by its update")
    parser.add_argument("--net", type=int, default=64, help="width of the policy's and value's two hidden layers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.threads)
    env = make_vec_env("CartPole-v1", n_envs=args.n_envs, seed=args.seed)
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs,
                policy_kwargs={"net_arch": [args.net, args.net]}, device=args.device, seed=args.seed, verbose=0)
    start, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=args.updates * args.n_steps * args.n_envs)
    print(json.dumps({"num_timesteps": model.num_timesteps, "learn_seconds": time.perf_counter() - start,
                      "learn_cpu_seconds": time.process_time() - cpu}))


if __name__ == "__main__":
    main()
