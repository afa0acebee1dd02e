"""`python -m benches.launch PARENT_PID COMMAND...`: runs COMMAND so that it dies with the harness.

A sweep killed with SIGKILL cannot clean up, and an orphaned trainer would go on loading the machine while a
resumed sweep measures. On Linux the kernel's parent-death signal ends the child instead; it survives the
exec below. This small launcher sets it from a fresh single-threaded process, which is safe where a
`preexec_fn` in the threaded harness is not.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent_pid, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The harness may have died before the signal was armed.
        if os.getppid() != parent_pid:
            sys.exit(f"launch: the harness (pid {parent_pid}) is gone")
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
