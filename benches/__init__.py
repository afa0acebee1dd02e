"""Bench harness: sweep suites over the reference trainer, each point in its own process, every sample stored."""
