"""Start one process per rank of a benchmark script and wait for them (gloo on CPU, one thread each);
the rank's side: its hidden arguments and joining the world."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from ebbflow_devtools.ports import free_port


def run_ranks(script: str, arguments: list[str], workers: int) -> None:
    """``python script *arguments --port P --rank r`` for every rank; raises if any fails."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, script, *arguments, "--port", str(port)]
    processes = [subprocess.Popen([*command, "--rank", str(rank)], env=env) for rank in range(workers)]
    codes = [process.wait() for process in processes]
    if any(codes):
        raise SystemExit(f"workers exited with {codes}")


def rank_parser(description: str, workers: int) -> argparse.ArgumentParser:
    """A benchmark's parser with ``--workers`` (the ranks ``run_ranks`` starts, ``workers`` unless told)
    and the ``--rank`` and ``--port`` that ``run_ranks`` adds, hidden from ``--help``; without
    ``--rank`` the script is the parent that starts the ranks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def join_world(rank: int, world_size: int, port: int) -> None:
    """This rank joins the gloo world that ``run_ranks`` started, on one torch thread."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
