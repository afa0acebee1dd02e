"""Reports: regression verdicts, run reports, machine comparisons and the nightly trend, all read from the
results store (benches/store.py) and never from the trainer's internals."""
