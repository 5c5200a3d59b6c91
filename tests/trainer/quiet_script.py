"""A torchrun script whose ranks meet once and never again: each world's process group forms, rank 0
appends a ``start`` event (the world's size) to ``--events``, and then every rank only sleeps. No
collective of the survivors can fail when a peer goes: only the rendezvous can re-form their world.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--seconds", type=float, required=True, help="how long each world sleeps")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        with args.events.open("a") as events:
            events.write(json.dumps({"event": "start", "world": dist.get_world_size()}) + "\n")
    time.sleep(args.seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
