"""Free TCP ports for rendezvous of local ranks, and retrying when another process takes one first."""

from __future__ import annotations

import re
import socket
from typing import Callable, TypeVar

T = TypeVar("T")
# How a rendezvous reports a port that something else listens on (TCPStore, gloo, nccl, torchrun's c10d).
_ADDRESS_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno:? 98\b", re.IGNORECASE)
PORT_ATTEMPTS = 5


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
