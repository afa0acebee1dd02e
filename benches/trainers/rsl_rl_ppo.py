"""rsl-rl's PPO as Isaac Lab's users run it (`OnPolicyRunner(env, cfg).learn(...)`), unedited, over a small batched
torch env of rsl-rl's `VecEnv` kind defined here (a point on a plane steered to the origin): the command `rlperf
attach` and the benches measure. Prints the trainer's own count of agent steps (its logger's `tot_timesteps`) and
the seconds `learn` took, as JSON: the count attach must match, and the speed its cost is measured by."""

from __future__ import annotations

import argparse
import tempfile

from benches.trainers.driver import ppo_parser, report, timed_training


def point_env_class():
    """The env class, built once torch and rsl-rl are imported (the module imports neither at the top)."""
    import torch
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    class PointEnv(VecEnv):
        """`num_envs` points on a plane, each pushed by a 2-D action and rewarded for nearing the origin; an
        episode ends after `max_episode_length` steps."""

        def __init__(self, num_envs: int, device: str, seed: int):
            self.num_envs, self.num_actions, self.max_episode_length = num_envs, 2, 64
            self.device, self.cfg = device, {}
            self.generator = torch.Generator(device=device).manual_seed(seed)
            self.position = torch.zeros(num_envs, 2, device=device)
            self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long, device=device)
            self.reset_points(torch.ones(num_envs, dtype=torch.bool, device=device))

        def reset_points(self, done: torch.Tensor) -> None:
            fresh = torch.rand(self.num_envs, 2, generator=self.generator, device=self.device) * 4 - 2
            self.position = torch.where(done[:, None], fresh, self.position)
            self.episode_length_buf = torch.where(done, torch.zeros_like(self.episode_length_buf),
                                                  self.episode_length_buf)

        def get_observations(self) -> TensorDict:
            return TensorDict({"policy": self.position.clone()}, batch_size=[self.num_envs])

        def step(self, actions: torch.Tensor):
            self.position = self.position + 0.1 * actions.clamp(-1, 1)
            reward = -self.position.norm(dim=1)
            self.episode_length_buf += 1
            time_outs = self.episode_length_buf >= self.max_episode_length
            self.reset_points(time_outs)
            return self.get_observations(), reward, time_outs, {"time_outs": time_outs}

    return PointEnv


def train_cfg(args: argparse.Namespace) -> dict:
    """rsl-rl 5.x's runner configuration, as its documentation writes it."""
    hidden = [args.net, args.net]
    model = {"class_name": "rsl_rl.models.MLPModel", "hidden_dims": hidden, "activation": "elu"}
    return {
        "num_steps_per_env": args.n_steps, "save_interval": 10_000, "obs_groups": {"actor": ["policy"],
                                                                                   "critic": ["policy"]},
        "actor": {**model, "distribution_cfg": {"class_name": "rsl_rl.modules.distribution.GaussianDistribution",
                                                "init_std": 1.0}},
        "critic": model,
        "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": args.n_epochs,
                      "num_mini_batches": args.mini_batches, "learning_rate": 1e-3, "schedule": "adaptive"},
        "logger": "tensorboard", "check_for_nan": True,
    }


def main() -> None:
    parser = ppo_parser(__doc__, n_envs=64, n_steps=24, batch_size=None)
    parser.add_argument("--mini-batches", type=int, default=4, help="minibatches per learning epoch")
    args = parser.parse_args()

    import contextlib
    import io

    import torch
    from rsl_rl.runners import OnPolicyRunner

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    env = point_env_class()(args.n_envs, args.device, args.seed)
    with tempfile.TemporaryDirectory() as log_dir:  # its logger counts steps only with somewhere to write them
        with contextlib.redirect_stdout(io.StringIO()):  # the runner prints its models and a table per update
            runner = OnPolicyRunner(env, train_cfg(args), log_dir=log_dir, device=args.device)
            with timed_training() as seconds:
                runner.learn(num_learning_iterations=args.updates)
    report("tot_timesteps", runner.logger.tot_timesteps, seconds,
           mean_reward=float(sum(runner.logger.rewbuffer) / max(1, len(runner.logger.rewbuffer))))


if __name__ == "__main__":
    main()
