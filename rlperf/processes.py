"""Child processes: started so that they die with whoever started them, and the ranks of a local
torch.distributed job started on a free port, watched through heartbeat files and stopped together.

An orphaned trainer would load the machine a resumed sweep measures, so every child arms the parent-death signal
(docs/sweeps-and-reports.md#one-sweep-at-a-time-faults-and-interruptions). Only the standard library is imported at
the top: run as a script, this file must not import anything from the directory a caller runs the command in.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, TypeVar

T = TypeVar("T")
PR_SET_PDEATHSIG = 1
# Set for the ranks `launch_ranks` starts: the directory holding their heartbeat files and logs, where rank 0
# also leaves what the launcher collects.
RANK_DIR_ENV = "RLPERF_RANK_DIR"
POLL_SECONDS = 0.1
# Starting a rank (importing torch, meeting the other ranks) makes no progress, and eight ranks importing
# torch at once on a busy host can take tens of seconds: until its first beat a rank is allowed at least this.
STARTUP_GRACE_SECONDS = 60.0
PORT_ATTEMPTS = 5
# How a rendezvous reports a port that something else listens on (TCPStore, gloo, nccl, torchrun's c10d).
_ADDRESS_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno:? 98\b", re.IGNORECASE)


# ---- dying with the parent ----------------------------------------------------------------------------------

def spawn(command: list[str], **popen_options) -> subprocess.Popen:
    """Starts `command` (Popen's options, `cwd` and `env` included, as given) so that it is killed when this
    process dies, even by SIGKILL. The child's pid is the command's: the arming script execs it.

    The kernel sends the signal when the *thread* that started the child ends: spawn from a thread that
    lives as long as the child should (the main thread)."""
    arm = [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())]
    return subprocess.Popen([*arm, *command], **popen_options)


def _arm_then_exec(argv: list[str]) -> None:
    """`python -I processes.py PARENT_PID COMMAND...`: arms the parent-death signal, then becomes COMMAND."""
    parent_pid, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        # The parent may have died before the signal was armed.
        if os.getppid() != parent_pid:
            sys.exit(f"spawn: the parent (pid {parent_pid}) is gone")
    os.execvp(command[0], command)


def run_to_completion(command: list[str], timeout_s: float | None = None, **popen_options) -> int:
    """Runs a child that dies with this process to its end (Popen's options, `cwd` and `env` included, as given);
    on Ctrl-C the child is ended first; past `timeout_s` it is killed, with what it started, and 124 returned."""
    child = spawn(command, **({"start_new_session": True} if timeout_s is not None else {}), **popen_options)
    try:
        return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return 124
    except KeyboardInterrupt:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


def signal_name(returncode: int) -> str | None:
    """The name of the signal that ended a child (a negative return code), None for an exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


# ---- stopped from outside ----------------------------------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT (a CI step's timeout or cancellation, a `kill`, `timeout`) end what runs inside as
    Ctrl-C does: the runs in flight are marked interrupted and temporary checkouts removed. SIGINT too, because a
    process started in the background by a shell inherits it ignored."""
    previous = {number: signal.signal(number, raise_interrupt) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


# ---- rendezvous ports ---------------------------------------------------------------------------------------

class PortTaken(Exception):
    """The port picked for a rendezvous was taken by another process before the ranks bound it."""

    def __init__(self, port: int):
        super().__init__(f"port {port} was taken before the ranks could bind it")
        self.port = port


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous of local ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(text: str) -> bool:
    """Whether a rank's output says its rendezvous port was already in use."""
    return _ADDRESS_IN_USE.search(text) is not None


def with_free_port(attempt: Callable[[int], T], attempts: int = PORT_ATTEMPTS) -> T:
    """Calls `attempt(port)` with a port free now; again with a fresh port while it raises PortTaken.

    A free port is found by binding port 0 and releasing it, which leaves a window in which another
    process can take it: a collision costs one retry, not the run."""
    for remaining in range(attempts - 1, -1, -1):
        try:
            return attempt(free_local_port())
        except PortTaken:
            if not remaining:
                raise
    raise AssertionError("unreachable")


# ---- heartbeats ---------------------------------------------------------------------------------------------

class Progress(NamedTuple):
    count: int  # beats so far; 0 while the rank is still starting
    last_beat_ns: int  # time.monotonic_ns() of the last beat, a clock all processes of the machine share
    stage: int  # where the rank is, in the caller's own terms (collectives: which op), and a size there
    size: int


STARTING = Progress(0, 0, 0, 0)


def heartbeat_path(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank}.beat"


def log_path(directory: Path, rank: int) -> Path:
    return directory / f"rank{rank}.log"


class Heartbeat:
    """A rank's `Progress` in four int64 slots of a small file the launcher reads. A beat is a store into
    a mapped page, no system call, well under a microsecond: it can sit in every rollout step and between
    timed collectives. Without a launcher (torchrun) the slots are plain memory."""

    SLOTS = struct.Struct("4q")

    def __init__(self, path: Path | None = None):
        if path is None:
            self._slots = memoryview(bytearray(self.SLOTS.size)).cast("q")
            return
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), self.SLOTS.size)
        self._slots = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, path: Path) -> None:
        """The file for a rank about to start, before its first beat."""
        path.write_bytes(cls.SLOTS.pack(*STARTING))

    @classmethod
    def read(cls, path: Path) -> Progress | None:
        try:
            return Progress(*cls.SLOTS.unpack(path.read_bytes()))
        except (OSError, struct.error):
            return None

    @classmethod
    def of_this_rank(cls) -> "Heartbeat | None":
        """The heartbeat of this process when `launch_ranks` started it, else None."""
        if RANK_DIR_ENV not in os.environ:
            return None
        return cls(heartbeat_path(Path(os.environ[RANK_DIR_ENV]), int(os.environ["RANK"])))

    def beat(self) -> None:
        self._slots[1] = time.monotonic_ns()
        self._slots[0] += 1

    def at(self, stage: int, size: int = 0) -> None:
        """Says where the rank is without counting as progress (it is still starting, say)."""
        self._slots[2] = stage
        self._slots[3] = size

    def enter(self, stage: int, size: int = 0) -> None:
        self.at(stage, size)
        self.beat()


# ---- launching and watching ranks ---------------------------------------------------------------------------

def rank_gpu(local_rank: int, visible_gpus: int, environ: dict[str, str] | os._Environ = os.environ) -> int:
    """The index, among the GPUs this process sees, of the GPU a rank uses: its LOCAL_RANK, except when an
    outside launcher gave the rank exactly one GPU, which is then its GPU whatever its LOCAL_RANK: SLURM and
    Kubernetes name that one GPU in CUDA_VISIBLE_DEVICES, or start one rank on the node (LOCAL_WORLD_SIZE 1).
    Two ranks started on a one-GPU machine see one GPU without either sign and keep LOCAL_RANK, so the device
    check refuses the second in one line instead of both training on GPU 0 (nccl would fail later, on a
    duplicate GPU). Ranks `launch_ranks` starts see every GPU of the machine and keep LOCAL_RANK."""
    if visible_gpus != 1 or RANK_DIR_ENV in environ:
        return local_rank
    named = [device for device in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if device.strip()]
    return 0 if len(named) == 1 or environ.get("LOCAL_WORLD_SIZE") == "1" else local_rank


class RankFailed(RuntimeError):
    """A rank died or stopped making progress; the message names it."""


def launch_ranks(world_size: int, command_for: Callable[[int, Path], list[str]], collect: Callable[[Path], T],
                 rank_timeout: float, where: Callable[[Progress], str] | None = None,
                 on_progress: Callable[[list[Progress]], None] | None = None) -> T:
    """Starts `command_for(rank, directory)` for each rank on this machine, each dying with this process,
    watches them (`watch`) and returns `collect(directory)` once every rank has exited cleanly. The ranks
    meet on a free port of 127.0.0.1; one taken by another process before the ranks bind it costs another
    attempt on a new port, with a fresh directory (an earlier attempt's heartbeats would read as stalls)."""
    def attempt(port: int) -> T:
        with tempfile.TemporaryDirectory(prefix="rlperf-ranks-") as tmp:
            return _run_ranks(world_size, command_for, collect, rank_timeout, where, on_progress, Path(tmp), port)

    try:
        return with_free_port(attempt)
    except PortTaken as taken:
        raise RankFailed(f"{taken}, {PORT_ATTEMPTS} times in a row") from None


def _run_ranks(world_size: int, command_for: Callable[[int, Path], list[str]], collect: Callable[[Path], T],
               rank_timeout: float, where: Callable[[Progress], str] | None,
               on_progress: Callable[[list[Progress]], None] | None, directory: Path, port: int) -> T:
    env = {**os.environ, "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), RANK_DIR_ENV: str(directory)}
    ranks: list[subprocess.Popen] = []
    try:
        for rank in range(world_size):
            Heartbeat.create(heartbeat_path(directory, rank))
            with open(log_path(directory, rank), "w") as log:
                ranks.append(spawn(command_for(rank, directory), stdout=log, stderr=subprocess.STDOUT,
                                   env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}))
        try:
            watch(ranks, directory, rank_timeout, where, on_progress)
        except RankFailed:
            if any(port_taken(log_path(directory, rank).read_text(errors="replace")) for rank in range(world_size)):
                raise PortTaken(port) from None
            raise
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return collect(directory)


def watch(ranks: list[subprocess.Popen], directory: Path, timeout: float,
          where: Callable[[Progress], str] | None = None,
          on_progress: Callable[[list[Progress]], None] | None = None,
          startup_grace: float = STARTUP_GRACE_SECONDS) -> None:
    """Returns when every rank has exited cleanly; raises RankFailed naming the rank that failed or went silent.

    When one rank dies or hangs its peers stop too, in their next collective. Ranks that exited badly in the
    same poll are all named, those killed by a signal first: a killed rank makes its peers fail too
    ("connection closed"). A rank is silent from its last beat, or from the start while it has not beaten
    yet, and then at least `startup_grace` applies instead of the timeout. `where` describes a rank's
    progress for the message; `on_progress` hears every change of it."""
    started = time.monotonic_ns()
    heard: list[Progress] = []
    while True:
        codes = [proc.poll() for proc in ranks]
        failed = sorted((code >= 0, rank) for rank, code in enumerate(codes) if code not in (None, 0))
        if failed:
            raise RankFailed("; ".join(exit_text(rank, codes[rank], directory) for _, rank in failed))
        if all(code == 0 for code in codes):
            return
        progress = [Heartbeat.read(heartbeat_path(directory, rank)) or STARTING for rank in range(len(ranks))]
        if on_progress is not None and progress != heard:
            on_progress(progress)
        heard = progress
        now = time.monotonic_ns()
        running = [rank for rank, code in enumerate(codes) if code is None]
        silence = {rank: (now - (progress[rank].last_beat_ns if progress[rank].count else started)) / 1e9
                   for rank in running}
        limit = {rank: timeout if progress[rank].count else max(timeout, startup_grace) for rank in running}
        if any(silence[rank] > limit[rank] for rank in running):
            raise RankFailed(stall_text(ranks, progress, running, silence, limit, where))
        time.sleep(POLL_SECONDS)


def exit_text(rank: int, code: int, directory: Path) -> str:
    name = signal_name(code)
    if name is not None:
        return f"rank {rank} was killed by {name}"
    try:
        lines = [line.strip() for line in log_path(directory, rank).read_text(errors="replace").splitlines()]
    except OSError:
        lines = []
    said = [line for line in lines if line]
    return f"rank {rank} exited with code {code} ({said[-1] if said else 'no message'})"


def stall_text(ranks: list[subprocess.Popen], progress: list[Progress], running: list[int],
               silence: dict[int, float], limit: dict[int, float], where: Callable[[Progress], str] | None) -> str:
    """Names the rank(s) holding the job up: those that got least far, since their peers went on into a
    collective (a beat) and wait there for them. Ranks with equal progress may all sit in one collective,
    the stuck one indistinguishable from those waiting for it, unless the operating system says it is
    stopped. The silence stated is the named ranks' own, measured, not the limit it passed."""
    fewest = min(progress[rank].count for rank in running)
    lagging = [rank for rank in running if progress[rank].count == fewest]
    named = [rank for rank in lagging if process_status(ranks[rank].pid) == "stopped"] or lagging
    quietest = min(named, key=lambda rank: silence[rank])
    names = f"rank {named[0]}" if len(named) == 1 else "ranks " + ", ".join(map(str, named))
    text = f"{names} made no progress for {silence[quietest]:.1f} s (rank_timeout {limit[quietest]:g} s)"
    if where is None:
        return text
    if len(lagging) < len(running):
        ahead = max(running, key=lambda rank: progress[rank].count)
        return f"{text} at {where(progress[named[0]])}; the other ranks wait in {where(progress[ahead])}"
    return f"{text}, all inside {where(progress[named[0]])}"


def process_status(pid: int) -> str | None:
    import psutil

    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


if __name__ == "__main__":
    _arm_then_exec(sys.argv[1:])
