"""A sharded job's durable checkpoints on a shared volume: each rank writes its own pieces, and a resume
reads only the pieces its new piece needs (docs/design/sharded.md, "Sharded checkpoints").

Layout under ``spec.checkpoint.path``: ``shards-<step, 12 digits>/shard-<rank>-of-<N>.pt``, a state's
bytes (MAGIC, SHA-256, the payload of ``state.capture_shard``), and ``manifest.json`` beside them,
which rank 0 writes once every rank wrote its file, naming the world, each file's size and SHA-256,
and each sharded entry's whole dim-0 length (so a reader needs no model to reshard).
A checkpoint exists once its manifest does. Rank 0 then removes every other step's directory but the
newest committed one before it, so the two newest are kept, as with whole checkpoints.

A reader at rank j of a world of M loads the old shards whose rows overlap its new piece
(``buddies.overlap``) and shard 0's, which carries the state every rank shares; ``whole`` joins every
piece (for a replicated engine, or a tool reading the result). Invariants: a file that does not
match its manifest is refused, and so is its checkpoint, never loaded in part.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ebbflow_trainer.launch import state
from ebbflow_trainer.launch.buddies import overlap
from ebbflow_trainer.launch.shard_copies import Lengths, piece_from, rows_for, shared_part

log = logging.getLogger("ebbflow_trainer.launch.sharded_checkpoints")

MANIFEST = "manifest.json"
_DIRECTORY = re.compile(r"^shards-(\d{12})$")


def directory(root: Path, step: int) -> Path:
    return root / f"shards-{step:012d}"


def shard_file(root: Path, step: int, shard: int, world: int) -> Path:
    return directory(root, step) / f"shard-{shard}-of-{world}.pt"


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: the step, the world that wrote it, each shard file's size and SHA-256
    (hex) in shard order, and the whole length of every sharded entry."""

    root: Path
    step: int
    world: int
    files: tuple[tuple[int, str], ...]
    lengths: Lengths

    def to_json(self) -> str:
        files = [{"shard": i, "size": size, "sha256": digest} for i, (size, digest) in enumerate(self.files)]
        model, optimizer = self.lengths
        lengths = {"model": model, "optimizer": [[index, key, n] for (index, key), n in optimizer.items()]}
        return json.dumps({"step": self.step, "world": self.world, "files": files, "lengths": lengths})

    @classmethod
    def from_json(cls, root: Path, text: str) -> Manifest:
        data = json.loads(text)
        world = int(data["world"])
        files = sorted(data["files"], key=lambda f: int(f["shard"]))
        if [int(f["shard"]) for f in files] != list(range(world)):
            raise ValueError(f"names shards {[f['shard'] for f in files]}, not 0-{world - 1}")
        lengths = (
            {str(name): int(n) for name, n in data["lengths"]["model"].items()},
            {(int(index), str(key)): int(n) for index, key, n in data["lengths"]["optimizer"]},
        )
        sizes = tuple((int(f["size"]), str(f["sha256"])) for f in files)
        return cls(root, int(data["step"]), world, sizes, lengths)

    def load(self, shard: int) -> dict[str, Any]:
        """Shard ``shard``'s snapshot, checked against the manifest and its own frame."""
        path = shard_file(self.root, self.step, shard, self.world)
        data = path.read_bytes()
        size, digest = self.files[shard]
        if len(data) != size or _digest(data) != digest:
            raise state.StateFileError(f"{path} does not match its manifest (size or SHA-256)")
        return state.from_bytes(data)


def _digest(data: bytes) -> str:
    """The payload's SHA-256 that a state's frame carries after its MAGIC."""
    return data[len(state.MAGIC) : len(state.MAGIC) + state.DIGEST_BYTES].hex()


def write_shard(root: Path, step: int, shard: int, world: int, data: bytes) -> None:
    """One rank's part of the checkpoint of ``step`` (not yet committed)."""
    state.write_atomic(data, shard_file(root, step, shard, world))


def commit(root: Path, step: int, world: int, lengths: Lengths) -> None:
    """Rank 0, once every rank wrote its file: the manifest, then every other step's directory but
    the newest committed one before this removed."""
    files = []
    for shard in range(world):
        path = shard_file(root, step, shard, world)
        with open(path, "rb") as handle:
            header = handle.read(len(state.MAGIC) + state.DIGEST_BYTES)
        files.append((path.stat().st_size, _digest(header)))
    manifest = Manifest(root, step, world, tuple(files), lengths)
    state.write_atomic(manifest.to_json().encode(), directory(root, step) / MANIFEST)
    keep = {m.step for m in committed(root)[:2]}
    for found in root.iterdir():
        matched = _DIRECTORY.match(found.name)
        if matched and int(matched[1]) not in keep:
            shutil.rmtree(found, ignore_errors=True)


def committed(root: Path) -> list[Manifest]:
    """The committed checkpoints under ``root``, newest first (an unreadable manifest is skipped, logged)."""
    found = []
    for path in root.glob(f"shards-*/{MANIFEST}") if root.is_dir() else []:
        if not _DIRECTORY.match(path.parent.name):
            continue
        try:
            found.append(Manifest.from_json(root, path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("refusing the sharded checkpoint %s: %s", path.parent, error)
    return sorted(found, key=lambda m: m.step, reverse=True)


def piece(manifest: Manifest, rank: int, world: int) -> dict[str, Any]:
    """Rank ``rank``'s pieces for a world of ``world``, as ``state.restore`` takes them (``"sharded"``
    names the pieces): the rows of each old shard its new piece holds, the rest from shard 0's."""
    template, lengths = manifest.load(0), manifest.lengths
    parts = []
    for shard in range(manifest.world):
        if not _overlaps(lengths, (shard, manifest.world), (rank, world)):
            continue
        snapshot = template if shard == 0 else manifest.load(shard)
        parts.append(rows_for(snapshot, lengths, (shard, manifest.world), (rank, world)))
    return piece_from(shared_part(template), parts)


def _overlaps(lengths: Lengths, old: tuple[int, int], new: tuple[int, int]) -> bool:
    every = [*lengths[0].values(), *lengths[1].values()]
    return any(overlap(length, old, new) is not None for length in every)


def whole(manifest: Manifest) -> dict[str, Any]:
    """The whole state (no ``"sharded"`` key): each sharded entry is its pieces joined in shard order."""
    snapshots = [manifest.load(shard) for shard in range(manifest.world)]
    joined = shared_part(snapshots[0])
    sharded = joined.pop("sharded")
    for name in sharded["model"]:
        joined["model"][name] = torch.cat([s["model"][name] for s in snapshots])
    for index, key in sharded["optimizer"]:
        pieces = [s["optimizer"]["state"][index][key] for s in snapshots]
        joined["optimizer"]["state"][index][key] = torch.cat(pieces)
    return joined
