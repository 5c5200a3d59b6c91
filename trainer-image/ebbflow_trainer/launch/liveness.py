"""Whether a node's launcher still runs, asked of the kernel rather than waited out in heartbeats.

Every launcher listens on a port of its own (:class:`LivenessEndpoint`) for as long as its process
lives and publishes the address in the job's store under its node (``liveness_key``). When a peer's
collective fails, the survivors ask that address: a refused connection means no process listens
there any more (the launcher died with its node's process tree, and the kernel closed its socket),
which is the evidence that lets them remove the node from the rendezvous at once. Anything else (a
connection accepted, as a frozen process's kernel still does; a timeout, as a vanished pod's address
gives) is no evidence, and such a node is left to heartbeat expiry.

Invariants: a live launcher's endpoint accepts every probe (a thread accepts and closes, so the
backlog never fills); :func:`refused` answers True only for ECONNREFUSED, :func:`accepts` only for
an accepted connection; a probe takes at most ``PROBE_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

PROBE_TIMEOUT_S = 0.5
CLOSE_TIMEOUT_S = 1.0  # for the accepting thread to return once its socket is shut down


def node_address(node_addr: str) -> str:
    """The address the other workers reach this node at: `node_addr` (--node-addr), else the IP its
    hostname resolves to (a pod's own IP, from the hosts file the kubelet writes)."""
    return node_addr or socket.gethostbyname(socket.gethostname())


def liveness_key(node: str) -> str:
    """The store key holding the liveness address of `node` (torch's node descriptor, as text)."""
    return f"ebbflow/liveness/{node}"


class LivenessEndpoint:
    """A listening socket on every interface, open while this process runs (the kernel closes it
    when the process dies, however it dies)."""

    def __init__(self, host: str) -> None:
        self._socket = socket.create_server(("", 0), backlog=64)
        self.address = f"{host}:{self._socket.getsockname()[1]}"
        self._acceptor = threading.Thread(
            target=self._accept_and_close, name="liveness endpoint", daemon=True
        )
        self._acceptor.start()

    def _accept_and_close(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            connection.close()

    def close(self) -> None:
        """Stop listening now: a shutdown wakes the accepting thread, which a bare close would not
        (the blocked accept keeps the socket listening)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._acceptor.join(timeout=CLOSE_TIMEOUT_S)


def _connection_error(address: str) -> OSError | None:
    """Why a connection to `address` (host:port) failed within PROBE_TIMEOUT_S; None: it was accepted."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as error:
        return error


def refused(address: str) -> bool:
    """Whether `address` refuses a connection: nothing listens there any more. A timeout or an
    unreachable host proves nothing."""
    return isinstance(_connection_error(address), ConnectionRefusedError)


def accepts(address: str) -> bool:
    """Whether `address` accepts a connection: a launcher (running, or frozen) still listens there."""
    return _connection_error(address) is None
