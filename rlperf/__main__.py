"""`python -m rlperf`: the `rlperf` command (command/cli.py). A script that no module imports, so the contracts of
this folder still import nothing above them; trainer processes, torchrun and older checkouts start `-m rlperf`."""

import sys

from command.cli import main

sys.exit(main())
