"""The test suite measures apart from the machine: its own measurement lock, inherited by child processes."""

import subprocess
import sys

from rlperf.lock import DEFAULT_PATH, lock_path


def test_the_suite_takes_a_lock_of_its_own_and_children_inherit_it(private_measurement_lock, tmp_path_factory):
    assert lock_path() == private_measurement_lock and str(private_measurement_lock) != DEFAULT_PATH
    assert tmp_path_factory.getbasetemp() in private_measurement_lock.parents
    child = subprocess.run([sys.executable, "-c", "from rlperf.lock import lock_path; print(lock_path())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(private_measurement_lock)

