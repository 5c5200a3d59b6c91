"""The next-world file between an agent and its running worker (a join in place): written whole,
read once, and never taken from an earlier process."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from ebbflow_trainer.launch import world_switch
from ebbflow_trainer.launch.world_switch import NextWorldFile, World, write_next_world
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

NEXT = World(rank=2, size=3, generation=7, local_rank=1)


def test_the_next_world_is_read_as_written_and_only_once(tmp_path: Path) -> None:
    worker = NextWorldFile(tmp_path)
    assert not worker.pending()
    write_next_world(tmp_path, NEXT)
    assert worker.pending()
    assert worker.take() == NEXT
    assert not worker.pending()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary left beside it


def test_a_file_left_by_an_earlier_process_names_no_world_of_the_new_one(tmp_path: Path) -> None:
    write_next_world(tmp_path, NEXT)
    assert not NextWorldFile(tmp_path).pending()


def test_a_world_that_restarts_instead_discards_a_next_world_written_for_it(tmp_path: Path) -> None:
    worker = NextWorldFile(tmp_path)
    worker.discard()  # none written: nothing to do
    write_next_world(tmp_path, NEXT)
    worker.discard()
    assert not worker.pending()


def test_a_laggard_waits_for_its_agent_and_gives_up_at_the_deadline(tmp_path: Path) -> None:
    worker = NextWorldFile(tmp_path)
    assert not worker.wait(0.05)
    writer = threading.Timer(0.05, write_next_world, (tmp_path, NEXT))
    writer.start()
    try:
        assert worker.wait(10.0)
    finally:
        writer.join()
    assert worker.take() == NEXT


def test_started_workers_and_agents_add_to_the_same_ready_count() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    generation = PrefixStore(world_switch.generation_prefix("job-a", 4), store)
    assert generation.add(world_switch.READY_KEY, 1) == 1  # a newcomer's worker, as it starts
    assert store.add(world_switch.ready_key("job-a", 4), 2) == 3  # an agent's two running workers
    assert store.add(world_switch.ready_key("job-a", 5), 0) == 0  # the next world counts afresh
