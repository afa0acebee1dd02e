"""rlperf: where does PPO+LSTM training time go, and did the last commit make it slower."""

__version__ = "0.1.0"
