import socket


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous of local ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
