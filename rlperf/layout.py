"""Where rlperf writes: an output directory holds the results store and one folder per run. Kept free of
imports beyond the standard library, so the workflow's steps can read it with a bare system Python."""

DEFAULT_OUT = "runs"
STORE_FILE = "results.sqlite"
