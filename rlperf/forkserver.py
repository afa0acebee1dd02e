"""Trainer processes forked from a warm interpreter: each repeat is still a process of its own, but it starts
with torch already imported instead of paying for the import (docs/sweeps-and-reports.md#the-processes-a-sweep-starts).

A server forks only with no other Python thread and CUDA not initialized, after a probe child has computed on the GPU.
Only the standard library is imported at the top: run as a script in another checkout's tree (the gate's
baseline), this file must not import anything from there before the child runs the module.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# how a repeat's process may start: forked from a server, or a fresh interpreter
LAUNCHES = ("forked", "fresh")
WARM_MODULES = ("numpy", "torch", "torch._dynamo", "torch.optim")
READY_TIMEOUT_S = 600.0  # importing torch on a loaded machine has taken over a minute
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


class ServerGone(RuntimeError):
    """The server ended (killed, or its machine ran out of memory) before it answered."""


def forkable(command: list[str]) -> bool:
    """Whether `command` is this interpreter running a module, which a server can fork instead of starting (on
    Linux, whose parent-death signal and process titles the children rely on)."""
    return (sys.platform.startswith("linux") and len(command) >= 3 and command[0] == sys.executable
            and command[1] == "-m")


class ForkedChild:
    """A child the server forked: waited for through the server, its CPU seconds reported when it ends."""

    def __init__(self, server: "ForkServer", pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.cpu_seconds = 0.0

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (negative: the signal that ended it); subprocess.TimeoutExpired after `timeout`."""
        if self.returncode is None:
            ended = self.server.receive(timeout)
            if ended is None:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self.returncode, self.cpu_seconds = ended["returncode"], ended["cpu_s"]
        return self.returncode


class ForkServer:
    """One warm interpreter in `cwd` (whose modules the children import, as `python -m` would there), started
    through `spawn` so that it dies with this process. `refused` names why it cannot fork, if it cannot."""

    def __init__(self, cwd: Path | None):
        from rlperf.processes import spawn

        ours, theirs = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()  # what the server says before it dies, for ServerGone's message
        self.process = spawn([sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())],
                             pass_fds=(theirs.fileno(),), cwd=cwd, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=self.stderr)
        theirs.close()
        self.socket = ours
        self.buffer = b""
        ready = self.receive(READY_TIMEOUT_S)
        if ready is None:
            self.close()
            raise ServerGone(f"the fork server (pid {self.process.pid}) was not ready in {READY_TIMEOUT_S:g} s")
        self.refused: str | None = ready["refused"]
        self.import_s: float = ready["import_s"]

    def start(self, command: list[str], log_path: Path, stdout_path: Path | None = None,
              cwd: Path | None = None) -> ForkedChild:
        """Forks `command` (`forkable`) in `cwd` (default the server's directory), whose modules it imports as
        `python -m` would there, its output appended to `log_path` (its standard output to `stdout_path` instead,
        if given)."""
        request = {"module": command[2], "args": command[3:], "log": str(Path(log_path).absolute()),
                   "stdout": str(Path(stdout_path).absolute()) if stdout_path is not None else None,
                   "cwd": str(Path(cwd).absolute()) if cwd is not None else None}
        try:
            self.socket.sendall(json.dumps(request).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server is gone: receive says how it ended
        started = self.receive(READY_TIMEOUT_S)
        if started is None:
            raise ServerGone(f"the fork server (pid {self.process.pid}) did not fork in {READY_TIMEOUT_S:g} s")
        return ForkedChild(self, started["pid"])

    def run(self, command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
        """Forks `command` and waits for it, its output captured as text as subprocess.run captures it; killed,
        and subprocess.TimeoutExpired raised, after `timeout_s`."""
        with tempfile.TemporaryDirectory(prefix="rlperf-forked-") as directory:
            stdout_path, stderr_path = Path(directory, "stdout"), Path(directory, "stderr")
            child = self.start(command, stderr_path, stdout_path)
            try:
                child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:  # not yet in a session of its own
                    os.kill(child.pid, signal.SIGKILL)
                child.wait()
                raise
            return subprocess.CompletedProcess(command, child.returncode, stdout_path.read_text(errors="replace"),
                                               stderr_path.read_text(errors="replace"))

    def receive(self, timeout: float | None) -> dict | None:
        """The server's next message; None when `timeout` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.socket], [], [], left)[0]:
                return None
            try:
                chunk = self.socket.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                from rlperf.processes import signal_name

                code = self.process.wait()
                ended = f"killed by {signal_name(code)}" if code < 0 else f"exit code {code}"
                self.stderr.seek(0)
                said = [line.strip() for line in self.stderr.read().decode(errors="replace").splitlines()]
                said = [line for line in said if line]
                raise ServerGone(f"the fork server (pid {self.process.pid}) ended ({ended})"
                                 + (f": {said[-1]}" if said else ""))
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        """Ends the server: it leaves when its socket closes."""
        self.socket.close()
        self.stderr.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---- the server ---------------------------------------------------------------------------------------------

def serve(sock: socket.socket) -> dict | None:
    """Imports WARM_MODULES, then forks a child per request until the socket closes. Returns a request in the
    child, None in the server when it is done."""
    started = time.perf_counter()
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a checkout that runs without it; its children import what they need
            pass
    refused = fork_hazard()
    send(sock, {"refused": refused, "import_s": time.perf_counter() - started})
    if refused:
        return None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is its caller's to handle
    reader = sock.makefile("rb")
    for line in reader:
        pid = os.fork()
        if pid == 0:
            reader.close()
            sock.close()
            return json.loads(line)
        send(sock, {"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        send(sock, {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime})
    return None


def fork_hazard() -> str | None:
    """Why forking this interpreter would give a child that is not a fresh process's equal, if it would."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads run after the imports"
    with open("/proc/self/maps") as maps:
        if any("libcuda.so" in line for line in maps):
            return cuda_hazard()
    return None


def cuda_hazard() -> str | None:
    """With the CUDA driver's library loaded, why a child forked now could not use CUDA, if it could not:
    torch initialized CUDA here, or a forked probe child's first work on the GPU failed (something else
    initialized it). On a machine without a GPU the probe finds none, which is no hazard."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "the CUDA driver was loaded by the imports, and without torch nothing says it was not initialized"
    if torch.cuda.is_initialized():
        return "torch initialized CUDA during the imports"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        failure = b""
        try:
            if torch.cuda.is_available():
                torch.ones(1, device="cuda").add_(1).cpu()
        except BaseException as error:  # whatever it is, the parent reports it and forks no trainer
            failure = f"{type(error).__name__}: {error}".encode()[:2000]
        os.write(write, failure)
        os._exit(1 if failure else 0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        failure = pipe.read().decode(errors="replace").strip()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        why = failure.splitlines()[0] if failure else f"exit code {code}"
        return f"a child forked after the imports could not use CUDA ({why})"
    return None


def send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def become(request: dict, server_pid: int) -> None:
    """In the child: a session of its own, killed with the server, output to the log, then the module as
    `python -m` runs it."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, " ".join([request["module"], *request["args"][:1]])[:15].encode(), 0, 0, 0)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != server_pid:
        os._exit(1)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if request["stdout"] else log
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout, 1)
    os.dup2(log, 2)
    for fd in {log, stdout, devnull}:
        os.close(fd)
    if request.get("cwd"):  # another checkout's code: the server imported none of it
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["args"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit_code(exit)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # Ends as a fresh interpreter would, less the teardown of the modules it was forked with: freeing them
    # writes to every page the fork shared (0.9 s a process here), as multiprocessing's forked children skip it.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def exit_code(exit: SystemExit) -> int:
    """The exit code an interpreter gives SystemExit's argument: None 0, an int itself, anything else printed
    and 1."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    sys.stderr.write(f"{exit.code}\n")
    return 1


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # the children import the caller's checkout, as `python -m` does in its cwd
    server_pid = os.getpid()
    request = serve(socket.socket(fileno=int(sys.argv[1])))
    if request is None:
        os._exit(0)  # nothing to clean up, and tearing down torch's modules would take a second
    become(request, server_pid)
