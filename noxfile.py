"""Sessions: `nox -s tests`, `nox -s bench`, `nox -s bench_micro`.

torch: by default each session installs the CPU build named by RLPERF_TORCH (torch==2.13.0).
On a GPU machine set RLPERF_TORCH=system: the session's virtualenv then sees the CUDA torch that
is already installed (system site-packages) and installs no torch of its own.
"""

import os

import nox

TORCH = os.environ.get("RLPERF_TORCH", "torch==2.13.0")
USE_SYSTEM_TORCH = TORCH == "system"
VENV_PARAMS = ["--system-site-packages"] if USE_SYSTEM_TORCH else []

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def install(session: nox.Session, extras: str) -> None:
    if not USE_SYSTEM_TORCH:
        # The first install downloads a few hundred MB and takes minutes: pip's own progress is shown, not
        # hidden as nox hides it by default.
        session.log(f"installing {TORCH} (a few hundred MB the first time; pip's progress follows)")
        session.install(TORCH, silent=False)
    session.install("-e", f".[{extras}]")


@nox.session(venv_params=VENV_PARAMS)
def tests(session: nox.Session) -> None:
    install(session, "test,profile,atari,trainers")
    session.run("pytest", *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def bench(session: nox.Session) -> None:
    """Runs the smoke suite that fits this machine and renders its report: `gpu-smoke` (LSTM-128 at 1024-4096
    envs, eager and graphed, fp32 and bf16) when torch sees a GPU, else `smoke` on the CPU (benches/suite.py,
    smoke_suite). Extra args replace those: `nox -s bench -- --suite nightly --out DIR`."""
    install(session, "profile,atari")
    args = session.posargs
    if not args:
        chosen = session.run("python", "-c", "from benches.suite import machine_smoke_suite; "
                             "print(machine_smoke_suite())", silent=True)
        if chosen is None:  # --install-only: nox runs nothing, so there is no suite to choose
            return
        args = ["--suite", chosen.strip().splitlines()[-1], "--device", "auto"]
    session.run("rlperf", "bench", *args)


@nox.session(venv_params=VENV_PARAMS)
def bench_micro(session: nox.Session) -> None:
    """pytest-benchmark micro-benchmarks; each run's JSON is saved under runs/micro/ (git-ignored), where
    `nox -s bench_micro -- --benchmark-compare` finds the previous one."""
    install(session, "test")
    session.run(
        "pytest", "benches/micro", "-p", "no:cacheprovider", "--benchmark-autosave",
        "--benchmark-storage=file://runs/micro", "-o", "testpaths=benches/micro", *session.posargs,
    )
