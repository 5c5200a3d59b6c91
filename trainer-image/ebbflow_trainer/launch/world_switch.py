"""A join in place: the running workers enter the next world without being restarted.

When a newcomer waits, the agents of a running world join the next round while their workers train
on; each new world's workers count themselves ready in the store (a newcomer once its worker has
built the model, a running worker through its agent); once all are, every agent writes each of its
workers' next world (generation, rank, size) into its state directory. A worker that finds it asks
to stop at the next step boundary, and there the whole world decides, in one all-reduce, whether
every member has its next world: then each builds the next world's process group in its own process
and the newcomer receives the state; else all stop for a restart as before.

Invariants: a worker enters a next world only when every member of its current one does, at the same
step; only workers that said they can (``IN_PLACE_MARKER``: a replicated engine) are switched, so a
torchrun script or a sharded model always restarts; a next world is read once (taking it removes it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

# Written by a worker whose world can change in its own process; read by its agent before it tries.
IN_PLACE_MARKER = "joins-in-place"
# The next world of one worker, written by its agent once every member of that world is ready.
NEXT_WORLD_FILE = "next-world.json"
# What an agent logs when it has given its running workers their next world (tests wait for it).
ENTERS_IN_PLACE_LOG = "the running workers enter it in place"
# How often an agent reads the ready count, and how often a worker looks for its next world.
POLL_SECONDS = 0.01
# A member that found no next world of its own when a peer asked to switch waits this long for its
# agent's (the agents write theirs within a poll of each other); then the world restarts instead.
LAGGARD_WAIT_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class World:
    """One worker's place in one world."""

    rank: int
    size: int
    generation: int
    local_rank: int = 0  # this process among the pod's --nproc-per-node


# The count of a world's workers ready to enter it, under its generation's prefix in the store: a
# started worker counts itself (through `rendezvous.generation_store`), an agent its running workers.
READY_KEY = "ready"


def generation_prefix(rdzv_id: str, generation: int) -> str:
    """Where one world's keys live in the job's store: its process group's bootstrap, its ready count."""
    return f"ebbflow/{rdzv_id}/generation/{generation}"


def ready_key(rdzv_id: str, generation: int) -> str:
    """The ready count's key in the store itself (a PrefixStore joins prefix and key with "/")."""
    return f"{generation_prefix(rdzv_id, generation)}/{READY_KEY}"


def write_next_world(directory: Path, world: World) -> None:
    """Atomically: a worker never reads half a file."""
    temporary = directory / f".{NEXT_WORLD_FILE}.tmp"
    temporary.write_text(json.dumps(dataclasses.asdict(world)))
    os.replace(temporary, directory / NEXT_WORLD_FILE)


class NextWorldFile:
    """A worker's view of the next world its agent wrote for it."""

    def __init__(self, directory: Path):
        self.path = directory / NEXT_WORLD_FILE
        self.path.unlink(missing_ok=True)  # a file left by an earlier process names no world of ours

    def pending(self) -> bool:
        return self.path.exists()

    def wait(self, seconds: float) -> bool:
        """Whether the next world came within ``seconds``."""
        deadline = time.monotonic() + seconds
        while not self.path.exists():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def take(self) -> World:
        """The next world, removed once read."""
        world = World(**json.loads(self.path.read_text()))
        self.path.unlink()
        return world

    def discard(self) -> None:
        """The world restarts instead: a next world written for this process names none it enters."""
        self.path.unlink(missing_ok=True)
