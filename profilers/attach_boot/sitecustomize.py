"""`rlperf attach`'s bootstrap: Python's `site` imports `sitecustomize` from the first directory of sys.path that
has one, and `rlperf attach` puts this directory first on the command's PYTHONPATH. In the process that owns the
run's summary (the first to start, RLPERF_PHASES_OWNER) it installs profilers/attach.py; in every process it then
runs the sitecustomize this one shadows, if there is one."""

import importlib.machinery
import importlib.util
import os
import sys


def _attach() -> None:
    owner = os.environ.get("RLPERF_PHASES_OWNER")
    if not os.environ.get("RLPERF_SUMMARY") or (owner is not None and owner != str(os.getpid())):
        return
    try:
        import rlperf.phases  # noqa: F401
    except ImportError:  # another interpreter than rlperf's: rlperf's source, after the command's own paths
        sys.path.append(os.environ["RLPERF_ATTACH_ROOT"])
    from profilers import attach

    attach.install()


def _shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [path for path in sys.path if os.path.abspath(path or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_attach()
_shadowed()
