import sys

from rlperf.cli import main

sys.exit(main())
