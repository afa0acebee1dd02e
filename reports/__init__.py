"""Reports: regression verdicts, run reports, machine comparisons and the nightly trend, all read from the
results store (rlperf/store.py) and never from the trainer's internals."""
