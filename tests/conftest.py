"""What every test gets: a measurement lock of its own test run.

`rlperf bench` and the commands built on it hold the machine-wide measurement lock while they measure
(rlperf/lock.py). A test run beside another rlperf measurement on the same machine would otherwise wait on
it, or with --no-wait be refused. The suite measures tiny configurations whose figures no test trusts, so it
takes a lock file under its own temporary directory instead; RLPERF_LOCK is set in the environment, so child
processes (`python -m rlperf ...`) use it too. Tests of the lock itself pass their own lock file.
"""

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_measurement_lock(tmp_path_factory):
    path = tmp_path_factory.mktemp("measurement-lock") / "bench.lock"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLPERF_LOCK", str(path))
        yield path
