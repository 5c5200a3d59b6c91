"""Durable checkpoints in S3-compatible object storage, uploaded while training goes on (docs/trainer.md,
"Checkpoints in object storage").

Layout under `s3://<bucket>/<prefix>/`: `step-<12 digits>/state.pt` (the state's bytes as on disk:
MAGIC, SHA-256, payload) and `step-<12 digits>/manifest.json`, written last, naming the object, its
size and SHA-256. A checkpoint exists once its manifest does; readers take the newest whose object
matches its manifest and whose state loads, and skip any other with a warning that names it.

Rank 0's worker leaves each snapshot in the node's outbox (node-local memory), as `torch.save`
writes it, and trains on; the launcher's `Uploader` thread, which outlives the worlds, frames the
newest snapshot there (magic, SHA-256: the bytes of a file checkpoint) and uploads it.
Invariants: at most one upload in flight; a newer snapshot supersedes an unfinished one (its
multipart upload is aborted between parts); older checkpoints are deleted only after a newer one
committed, and only beyond `retain`; a failed upload leaves every committed checkpoint as it was and
the training going (logged; the next snapshot tries again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ebbflow_api import contract

from ebbflow_trainer.config import TrainerConfig
from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.journal import Journal
from ebbflow_trainer.s3 import Credentials, S3Client, S3Error, S3Unreachable

log = logging.getLogger(__name__)

SCHEME = "s3://"
STATE_OBJECT = "state.pt"
MANIFEST_OBJECT = "manifest.json"
PART_BYTES = 8 << 20  # S3's smallest part is 5 MiB (but for the last)
OUTBOX = "outbox"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SNAPSHOT = re.compile(r"^step-(\d{12})\.pt$")


def is_object_store(path: str) -> bool:
    return path.startswith(SCHEME)


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, uri: str) -> Location:
        """`s3://bucket[/prefix]`; a ValueError saying what is wrong otherwise."""
        if not is_object_store(uri):
            raise ValueError(f"{uri!r} is not an s3:// URI")
        bucket, _, prefix = uri[len(SCHEME) :].partition("/")
        if not _BUCKET.match(bucket):
            raise ValueError(f"{bucket!r} in {uri!r} is not a bucket name (3-63 of a-z, 0-9, '.', '-')")
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "")

    def key(self, step: int, name: str) -> str:
        return f"{self.prefix}step-{step:012d}/{name}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"


class ObjectStoreError(Exception):
    """The checkpoint store cannot be used as configured (checked at start: exit 64)."""


def from_config(config: TrainerConfig, env: Mapping[str, str]) -> ObjectCheckpoints | None:
    """The job's object store when its checkpoint path is an s3:// URI (None otherwise), with the
    credentials of the standard AWS variables in `env`."""
    if not is_object_store(config.checkpoint_path):
        return None
    try:
        location = Location.parse(config.checkpoint_path)
    except ValueError as error:
        raise ObjectStoreError(f"{contract.ENV_CHECKPOINT_PATH} (spec.checkpoint.path): {error}") from None
    if not config.checkpoint_endpoint:
        raise ObjectStoreError(
            f"{contract.ENV_CHECKPOINT_ENDPOINT} is not set: an s3:// checkpoint path needs the store's "
            "endpoint (spec.checkpoint.endpoint, e.g. https://s3.us-east-1.amazonaws.com)"
        )
    credentials = Credentials.from_env(env)
    if credentials is None:
        raise ObjectStoreError(
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set: an s3:// checkpoint path needs "
            "credentials (spec.checkpoint.credentialsSecret names the Secret that holds them)"
        )
    try:
        client = S3Client(config.checkpoint_endpoint, credentials, env.get("AWS_REGION") or "us-east-1")
    except ValueError as error:
        raise ObjectStoreError(
            f"{contract.ENV_CHECKPOINT_ENDPOINT} (spec.checkpoint.endpoint): {error}"
        ) from None
    return ObjectCheckpoints(client, location)


class ObjectCheckpoints:
    """The job's checkpoints at one location."""

    def __init__(self, client: S3Client, location: Location) -> None:
        self.client, self.location = client, location

    def check(self) -> None:
        """Fail at start, not at the first checkpoint: the bucket must exist and the credentials work."""
        where = f"spec.checkpoint.path={self.location}"
        try:
            self.client.head_bucket(self.location.bucket)
        except S3Unreachable as error:
            raise ObjectStoreError(f"{where}: {error}; check spec.checkpoint.endpoint") from error
        except S3Error as error:
            fixes = {
                403: "the credentials were refused: check the Secret that "
                "spec.checkpoint.credentialsSecret names",
                404: f"bucket {self.location.bucket!r} does not exist: create it or change "
                "spec.checkpoint.path",
            }
            fix = fixes.get(error.status, "the store refused to show the bucket")
            raise ObjectStoreError(f"{where}: {fix} ({error})") from error

    def commit(self, data: bytes, step: int, superseded: Callable[[], bool] = lambda: False) -> bool:
        """Upload `data` as step `step`'s checkpoint, the manifest last. False when `superseded`
        said so between parts (the upload is aborted and nothing of it becomes visible)."""
        key = self.location.key(step, STATE_OBJECT)
        if len(data) <= PART_BYTES:
            self.client.put_object(self.location.bucket, key, data)
        elif not self._multipart(key, data, superseded):
            return False
        manifest = {"format": 1, "step": step, "object": STATE_OBJECT, "size": len(data)}
        manifest["sha256"] = hashlib.sha256(data).hexdigest()
        body = json.dumps(manifest, sort_keys=True).encode()
        self.client.put_object(self.location.bucket, self.location.key(step, MANIFEST_OBJECT), body)
        return True

    def _multipart(self, key: str, data: bytes, superseded: Callable[[], bool]) -> bool:
        bucket = self.location.bucket
        upload = self.client.create_multipart_upload(bucket, key)
        etags: list[str] = []
        try:
            for number, start in enumerate(range(0, len(data), PART_BYTES), 1):
                if superseded():
                    self.client.abort_multipart_upload(bucket, key, upload)
                    return False
                etags.append(
                    self.client.upload_part(bucket, key, upload, number, data[start : start + PART_BYTES])
                )
            self.client.complete_multipart_upload(bucket, key, upload, etags)
        except (S3Error, S3Unreachable):
            try:
                self.client.abort_multipart_upload(bucket, key, upload)
            except (S3Error, S3Unreachable) as error:
                log.warning(
                    "could not abort the upload of %s: %s (its parts stay until a lifecycle rule ends them)",
                    key,
                    error,
                )
            raise
        return True

    def committed_steps(self) -> list[int]:
        """The steps whose manifest exists, newest first."""
        pattern = re.compile(rf"^{re.escape(self.location.prefix)}step-(\d{{12}})/{MANIFEST_OBJECT}$")
        found = (
            pattern.match(key) for key in self.client.list_keys(self.location.bucket, self.location.prefix)
        )
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def newest(self) -> dict[str, Any] | None:
        """The newest committed checkpoint that matches its manifest and loads; None when none does."""
        for step in self.committed_steps():
            where = f"{self.location}step-{step:012d}"
            try:
                return self.load(step)
            except (S3Error, ValueError, KeyError, state.StateFileError) as error:
                log.warning("skipping the checkpoint %s: %s", where, error)
        return None

    def load(self, step: int) -> dict[str, Any]:
        """Step `step`'s checkpoint, checked against its manifest and loaded (errors raised)."""
        bucket = self.location.bucket
        manifest = json.loads(self.client.get_object(bucket, self.location.key(step, MANIFEST_OBJECT)))
        data = self.client.get_object(bucket, self.location.key(step, manifest["object"]))
        if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise ValueError(f"{len(data)} bytes that do not match its manifest (size or SHA-256)")
        return state.from_bytes(data)

    def prune(self, retain: int) -> None:
        """Delete every committed checkpoint but the newest `retain`: the manifest first, so that a
        half-deleted one is never taken for complete."""
        for step in self.committed_steps()[retain:]:
            for name in (MANIFEST_OBJECT, STATE_OBJECT):
                self.client.delete_object(self.location.bucket, self.location.key(step, name))


def outbox(state_dir: Path) -> Path:
    return state_dir / OUTBOX


def leave_snapshot(state_dir: Path, snapshot: dict[str, Any], step: int) -> None:
    """Rank 0's worker: the snapshot, as `torch.save` writes it, goes to the node's outbox for the
    launcher to frame and upload: the step pays for that write only, and the hashing and framing
    run in the launcher's process, beside the training instead of holding its interpreter."""
    path = outbox(state_dir) / f"step-{step:012d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(snapshot, temporary)
    os.replace(temporary, path)  # the launcher never sees half a snapshot


class Uploader(threading.Thread):
    """The launcher's upload thread: the newest snapshot in the outbox, committed, then pruned."""

    def __init__(
        self,
        checkpoints: ObjectCheckpoints,
        state_dir: Path,
        retain: int,
        journal: Journal,
        poll: float = 0.1,
    ) -> None:
        super().__init__(name="ebbflow-checkpoint-upload", daemon=True)
        self.checkpoints, self.retain, self.journal, self.poll = checkpoints, retain, journal, poll
        self.outbox = outbox(state_dir)
        self.outbox.mkdir(parents=True, exist_ok=True)
        self._stopping = threading.Event()
        self._idle = threading.Event()

    def _snapshots(self) -> list[tuple[int, Path]]:
        found = ((_SNAPSHOT.match(p.name), p) for p in self.outbox.iterdir())
        return sorted((int(m.group(1)), p) for m, p in found if m)

    def _newest(self) -> tuple[int, Path] | None:
        """The newest snapshot; the older ones are superseded and removed."""
        snapshots = self._snapshots()
        for _, path in snapshots[:-1]:
            path.unlink(missing_ok=True)
        return snapshots[-1] if snapshots else None

    def run(self) -> None:
        while not self._stopping.is_set():
            newest = self._newest()
            if newest is None:
                self._idle.set()
                self._stopping.wait(self.poll)
                continue
            self._idle.clear()
            self._upload(*newest)

    def _upload(self, step: int, path: Path) -> None:
        started = time.monotonic()
        data = state.frame(path.read_bytes())
        try:
            newer = lambda: max((s for s, _ in self._snapshots()), default=step) > step  # noqa: E731
            committed = self.checkpoints.commit(data, step, newer)
            if committed:
                self.checkpoints.prune(self.retain)
        except (S3Error, S3Unreachable) as error:
            log.warning("checkpoint of step %d not uploaded (training goes on): %s", step, error)
            self.journal.write("checkpoint-failed", step=step, error=str(error))
            if self._newest() == (step, path):  # nothing newer yet: try this one again after a pause
                self._stopping.wait(1.0)
            return
        if committed:
            seconds = time.monotonic() - started
            log.info(contract.COMMITTED_LOG, step, self.checkpoints.location, seconds)
            self.journal.write("checkpoint-committed", step=step, bytes=len(data), seconds=seconds)
        path.unlink(missing_ok=True)

    def drain(self, timeout: float) -> bool:
        """Wait until the outbox is empty (every snapshot committed or superseded); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._snapshots() and self._idle.is_set():
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stopping.set()
