"""Loopback ports for the servers that tests and benchmarks start (an API server, an operator's
health and metrics endpoints, a training store): below the kernel's ephemeral range.

A port found free by binding port 0 is the kernel's ephemeral pick, from the same pool that every
outgoing connection on the machine draws its local port from: between the probe and the server's own
bind, a client socket of any process may take it, and the server fails with "address already in
use". Ports below the range are never handed to client sockets. They are drawn at random there and
checked by binding, every probe held open until all are chosen, so the ports one call returns are
distinct; two servers started at once collide only if both draw the same port.

Standard library only.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_START = 32768  # the kernel's default, where the range cannot be read
LOWEST_PORT = 10000  # below: ports that well-known and registered services listen on


def ephemeral_start(range_file: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_EPHEMERAL_START


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` now, none of them in the ephemeral range."""
    candidates = list(range(LOWEST_PORT, ephemeral_start()))
    random.shuffle(candidates)
    probes: list[socket.socket] = []
    try:
        for port in candidates:
            probe = socket.socket()
            try:
                probe.bind((host, port))
            except OSError:
                probe.close()
                continue
            probes.append(probe)
            if len(probes) == count:
                return [p.getsockname()[1] for p in probes]
        raise OSError(f"fewer than {count} free ports on {host} below the ephemeral range")
    finally:
        for probe in probes:
            probe.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port free on `host` now, outside the ephemeral range."""
    return free_ports(1, host)[0]
