"""The trainer harness's book of the zygote's children: a pid handed out again (pids wrap) never
reports the exit status of the process that had it before."""

from __future__ import annotations

from ebbflow_devtools.testing.trainer_cluster import record_reply


def test_a_reused_pid_reports_its_new_process_exit_not_the_old_one() -> None:
    forked: list[int] = []
    exits: dict[int, int] = {}
    for reply in ({"pid": 4242}, {"exited": 4242, "code": 0}, {"pid": 4242}):
        record_reply(reply, forked, exits)
    assert forked == [4242, 4242]
    assert 4242 not in exits, "the new process with pid 4242 is still running"
    record_reply({"exited": 4242, "code": 65}, forked, exits)
    assert exits == {4242: 65}


def test_children_are_handed_out_in_the_order_forked() -> None:
    forked: list[int] = []
    exits: dict[int, int] = {}
    for reply in ({"pid": 7}, {"pid": 9}, {"exited": 9, "code": 1}):
        record_reply(reply, forked, exits)
    assert forked == [7, 9] and exits == {9: 1}
