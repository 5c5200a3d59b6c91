"""Start one process per rank of a benchmark script and wait for them (gloo on CPU, one thread each)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def run_ranks(script: str, arguments: list[str], workers: int) -> None:
    """``python script *arguments --port P --rank r`` for every rank; raises if any fails."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, script, *arguments, "--port", str(port)]
    processes = [subprocess.Popen([*command, "--rank", str(rank)], env=env) for rank in range(workers)]
    codes = [process.wait() for process in processes]
    if any(codes):
        raise SystemExit(f"workers exited with {codes}")
