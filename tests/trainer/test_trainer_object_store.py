"""Durable checkpoints in object storage with real trainer processes and a real S3 server (a local
SeaweedFS): uploads run while training goes on, a whole-job restart resumes from the store bitwise
like a calm run, a store killed mid-upload costs neither the previous checkpoint nor the training,
and a store the job cannot use stops it at start with exit 64, touching nothing.

The state carries 32 MiB of ballast (`ballast_digits.py`): an upload in four parts, long enough to
train through and to be interrupted."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_devtools.testing import seaweedfs
from ebbflow_devtools.testing.trainer_cluster import Job, Node, assert_bitwise_equal, running_job
from ebbflow_devtools.waiting import NotYet, wait_for
from ebbflow_trainer.launch.object_checkpoints import Location, ObjectCheckpoints

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "ballast_digits.py")
INTERVAL = 50


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweedfs.SeaweedFS]:
    why = seaweedfs.missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the object-store tests cannot run in CI: {why}", pytrace=False)
        pytest.skip(why)
    server = seaweedfs.start(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


def checkpoints(store: seaweedfs.SeaweedFS, bucket: str) -> ObjectCheckpoints:
    return ObjectCheckpoints(store.client(), Location.parse(f"s3://{bucket}/jobs/digits"))


def environment(job: Job, store: seaweedfs.SeaweedFS, bucket: str, **overrides: str) -> dict[str, str]:
    return job.environment(
        **{
            contract.ENV_CHECKPOINT_PATH: f"s3://{bucket}/jobs/digits",
            contract.ENV_CHECKPOINT_ENDPOINT: store.endpoint,
            contract.ENV_CHECKPOINT_INTERVAL_STEPS: str(INTERVAL),
            "AWS_ACCESS_KEY_ID": seaweedfs.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": seaweedfs.SECRET_KEY,
            **overrides,
        }
    )


def event(node: Node, kind: str, step: int) -> dict[str, Any] | NotYet:
    found = [e for e in node.events(kind) if e["step"] == step]
    return found[0] if found else NotYet(f"no {kind} event for step {step}; last step {node.last_step()}")


def test_uploads_run_while_training_and_a_whole_job_restart_resumes_from_the_store_bitwise(
    tmp_path: Path, store: seaweedfs.SeaweedFS, calm_reference: dict[str, Any]
) -> None:
    store.create_bucket("restart")
    first_root = tmp_path / "first"
    first_root.mkdir()
    with running_job(first_root, min_replicas=1, max_replicas=1, script=SCRIPT) as job:
        node = job.start_node(env=environment(job, store, "restart"))
        uploaded = wait_for(
            lambda: event(node, "checkpoint-committed", 2 * INTERVAL), 300, "step 100 committed"
        )
        node.kill_tree()  # every worker of the job lost at once
    snapshot = next(e for e in node.events("checkpoint") if e["step"] == 2 * INTERVAL)
    trained_meanwhile = [e for e in node.events("step") if snapshot["time"] < e["time"] < uploaded["time"]]
    assert trained_meanwhile, f"no step between the snapshot and its commit ({uploaded['seconds']:.2f} s)"
    assert checkpoints(store, "restart").committed_steps()[0] == 2 * INTERVAL

    second_root = tmp_path / "second"
    second_root.mkdir()
    with running_job(second_root, min_replicas=1, max_replicas=1, script=SCRIPT) as job:
        node = job.start_node(env=environment(job, store, "restart"))
        assert job.wait_all([node], 300) == [0], job.logs()
    first_world = node.events("generation")[0]
    assert (first_world["step"], first_world["source"]) == (2 * INTERVAL, "checkpoint"), first_world
    # Outside a cluster the progress report goes to the node's state directory, not to a local
    # folder named after the URI.
    assert json.loads((node.state_dir / "progress.json").read_text())["step"] == 200
    assert not Path("s3:").exists() and not (HERE.parents[1] / "s3:").exists()
    store_now = checkpoints(store, "restart")
    committed = store_now.committed_steps()
    assert committed[0] == 200 and len(committed) == 2, committed  # retain 2: the older ones deleted
    final = store_now.newest()
    assert final is not None and final["step"] == 200
    assert_bitwise_equal(final, calm_reference)


def test_a_store_killed_mid_upload_keeps_the_previous_checkpoint_and_the_training_going(
    tmp_path: Path, store: seaweedfs.SeaweedFS
) -> None:
    store.create_bucket("killed")
    with running_job(tmp_path, min_replicas=1, max_replicas=1, script=SCRIPT) as job:
        node = job.start_node(env=environment(job, store, "killed", **{contract.ENV_CHECKPOINT_RETAIN: "3"}))
        wait_for(lambda: event(node, "checkpoint-committed", INTERVAL), 300, "step 50 committed")
        wait_for(lambda: event(node, "checkpoint", 2 * INTERVAL), 300, "step 100's snapshot", interval=0.02)
        client = store.client()
        wait_for(lambda: client.multipart_uploads("killed"), 60, "step 100's upload under way", interval=0.02)
        store.kill()
        killed_at = node.last_step()
        failed = wait_for(lambda: event(node, "checkpoint-failed", 2 * INTERVAL), 120, "the upload's failure")
        assert killed_at is not None
        wait_for(
            lambda: (
                (node.last_step() or {}).get("step", 0) >= killed_at["step"] + 20 or NotYet("not training")
            ),
            120,
            "training on without the store",
        )
        store.start()
        assert INTERVAL in checkpoints(store, "killed").committed_steps(), failed
        assert job.wait_all([node], 300) == [0], job.logs()
    kept = checkpoints(store, "killed")
    assert kept.committed_steps()[0] == 200
    for step in kept.committed_steps():  # every committed checkpoint is whole
        assert kept.load(step)["step"] == step


@pytest.mark.parametrize(
    ("bucket", "secret", "says"),
    [
        pytest.param("refused", "wrong-secret", "the credentials were refused", id="wrong-credentials"),
        pytest.param("absent", seaweedfs.SECRET_KEY, "bucket 'absent' does not exist", id="missing-bucket"),
    ],
)
def test_a_store_the_job_cannot_use_stops_it_at_start_with_exit_64_touching_nothing(
    tmp_path: Path, store: seaweedfs.SeaweedFS, bucket: str, secret: str, says: str
) -> None:
    store.create_bucket("refused")
    before = checkpoints(store, "refused")
    before.commit(b"not a state, and never read", 7)
    with running_job(tmp_path, min_replicas=1, max_replicas=1) as job:
        env = environment(job, store, bucket, AWS_SECRET_ACCESS_KEY=secret)
        node = job.start_node(env=env)
        assert job.wait_all([node], 120) == [contract.EXIT_INVALID_CONFIG], job.logs()
    log = node.log.read_text(errors="replace")
    assert says in log and "spec.checkpoint" in log, log[-2000:]
    assert not node.events("generation")  # it never joined a world
    assert checkpoints(store, "refused").committed_steps() == [7]
