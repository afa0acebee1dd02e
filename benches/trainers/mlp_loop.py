"""A hand-written single-file PPO loop, as users write one without an RL library: Gymnasium's `SyncVectorEnv` of
CartPole-v1, a 64x64 MLP actor-critic, preallocated rollout buffers, GAE in a Python loop, clipped PPO over
minibatches. The dense loop `rlperf attach`'s cost is measured on (small policy, few envs: every step pays the hooks).
Prints its own count of agent steps and the seconds training took, as JSON."""

from __future__ import annotations

from benches.trainers.driver import ppo_parser, report, timed_training


def main() -> None:
    parser = ppo_parser(__doc__, n_envs=4, batch_size=128, device=False)
    args = parser.parse_args()

    import gymnasium as gym
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    n, horizon = args.n_envs, args.n_steps
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)  # no reset step to train on
    body = torch.nn.Sequential(torch.nn.Linear(4, args.net), torch.nn.Tanh(), torch.nn.Linear(args.net, args.net),
                               torch.nn.Tanh())
    model = torch.nn.ModuleDict({"body": body, "pi": torch.nn.Linear(args.net, 2), "v": torch.nn.Linear(args.net, 1)})

    def policy(obs):
        latent = model["body"](obs)
        return model["pi"](latent), model["v"](latent).squeeze(-1)

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    observations = torch.zeros(horizon, n, 4)
    actions = torch.zeros(horizon, n, dtype=torch.long)
    log_probs, values, rewards, dones = (torch.zeros(horizon, n) for _ in range(4))
    obs, _ = envs.reset(seed=args.seed)
    obs, steps = torch.as_tensor(obs, dtype=torch.float32), 0

    with timed_training() as seconds:
        for update in range(args.updates):
            for t in range(horizon):
                with torch.no_grad():
                    logits, value = policy(obs)
                distribution = torch.distributions.Categorical(logits=logits)
                action = distribution.sample()
                observations[t], actions[t], log_probs[t], values[t] = obs, action, distribution.log_prob(action), value
                next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
                rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
                dones[t] = torch.as_tensor(terminated | truncated, dtype=torch.float32)
                obs = torch.as_tensor(next_obs, dtype=torch.float32)
                steps += n
            with torch.no_grad():
                _, next_value = policy(obs)
            advantages, last = torch.zeros(horizon, n), torch.zeros(n)
            for t in reversed(range(horizon)):
                following = next_value if t == horizon - 1 else values[t + 1]
                delta = rewards[t] + 0.99 * following * (1 - dones[t]) - values[t]
                last = delta + 0.99 * 0.95 * (1 - dones[t]) * last
                advantages[t] = last
            returns = advantages + values
            flat = [tensor.reshape(horizon * n, *tensor.shape[2:]) for tensor in
                    (observations, actions, log_probs, advantages, returns)]
            for epoch in range(args.n_epochs):
                for batch in torch.randperm(horizon * n).split(args.batch_size):
                    b_obs, b_actions, b_log_probs, b_advantages, b_returns = (tensor[batch] for tensor in flat)
                    logits, value = policy(b_obs)
                    distribution = torch.distributions.Categorical(logits=logits)
                    ratio = (distribution.log_prob(b_actions) - b_log_probs).exp()
                    b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
                    clipped = torch.min(ratio * b_advantages, ratio.clamp(0.8, 1.2) * b_advantages)
                    loss = -clipped.mean() + 0.5 * (value - b_returns).pow(2).mean() - 0.01 * distribution.entropy().mean()
                    optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                    optimizer.step()
    report("steps", steps, seconds)


if __name__ == "__main__":
    main()
