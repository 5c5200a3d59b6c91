"""Ports for test and bench servers: outside the kernel's ephemeral range, distinct, free."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ebbflow_devtools.ports import LINUX_EPHEMERAL_START, LOWEST_PORT, ephemeral_start, free_ports

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("content", "start"),
    [
        pytest.param("32768\t60999\n", 32768, id="linux-default"),
        pytest.param("40000 65000", 40000, id="a-narrowed-range"),
        pytest.param("", LINUX_EPHEMERAL_START, id="empty-falls-back-to-the-default"),
        pytest.param("many", LINUX_EPHEMERAL_START, id="garbage-falls-back-to-the-default"),
    ],
)
def test_the_ephemeral_range_starts_where_the_kernel_says(tmp_path: Path, content: str, start: int) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text(content)
    assert ephemeral_start(range_file) == start


def test_a_missing_range_file_falls_back_to_the_default(tmp_path: Path) -> None:
    assert ephemeral_start(tmp_path / "absent") == LINUX_EPHEMERAL_START


def test_the_ports_are_distinct_below_the_ephemeral_range_and_a_server_binds_each() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(LOWEST_PORT <= port < ephemeral_start() for port in ports)
    servers = [socket.create_server(("127.0.0.1", port)) for port in ports]
    for server in servers:
        server.close()
