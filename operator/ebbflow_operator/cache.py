"""What the operator has observed of the cluster: the latest version of every node, pod, job and
Service it has seen, fed by watch events, by the answers to its own writes, and by periodic full
lists (an informer, as controller-runtime keeps one).

Passes read it instead of listing the cluster every time: listing 2000 pods costs seconds on a
small control plane. Versions are ordered by resourceVersion (etcd revisions), so a late event or
a list taken before a write never overwrites something newer, and a full list never resurrects an
object deleted while it was being taken.

An object version the parser rejects (e.g. a job from a newer schema) is left out, like an unknown
kind, but not silently: it is logged at WARNING and counted (`on_unparsable`) once per uid and
resourceVersion, however many relists bring it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .decision.model import Json

T = TypeVar("T")

log = logging.getLogger(__name__)

PARSE_ERRORS = (KeyError, TypeError, ValueError)  # what a parser raises for an object it cannot read


def _version(raw: Json) -> int:
    try:
        return int(raw.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _key(raw: Json) -> str:
    metadata = raw.get("metadata", {})
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _uid(raw: Json) -> str:
    return str(raw.get("metadata", {}).get("uid") or _key(raw))


@dataclass(frozen=True)
class _Entry(Generic[T]):
    version: int
    uid: str
    value: T


def _kept(current: _Entry[T], version: int, uid: str) -> bool:
    """Whether `current` stays against another copy at `version`: it is newer, or the very same
    version (a write's answer and then its watch event, or a relist). Keeping the same parsed
    object lets a pass tell by identity that nothing changed (decide.PlanMemo)."""
    return current.version > version or (current.version == version > 0 and current.uid == uid)


class Store(Generic[T]):
    """One kind of object, parsed once when it arrives. Thread-safe."""

    def __init__(
        self,
        parse: Callable[[Json], T],
        kind: str = "objects",
        on_unparsable: Callable[[], object] | None = None,
    ) -> None:
        """`on_unparsable` is called once per object version the parser rejects (a metric's inc)."""
        self._parse = parse
        self._kind = kind
        self._on_unparsable = on_unparsable
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry[T]] = {}
        self._deleted: dict[str, int] = {}  # uid -> version of the deletion (tombstones)
        self._unparsable: set[tuple[str, int]] = set()  # (uid, version) already reported

    def apply(self, raw: Json, deleted: bool = False) -> None:
        """An event or a write's answer: kept unless something newer is already known.

        A deletion is final for that object (uid), whatever versions arrive after it.
        """
        key, version, uid = _key(raw), _version(raw), _uid(raw)
        with self._lock:
            current = self._entries.get(key)
            if deleted:
                if current is not None and (current.uid == uid or current.version <= version):
                    del self._entries[key]
                self._deleted[uid] = max(version, self._deleted.get(uid, 0))
                return
            if uid in self._deleted or (current is not None and _kept(current, version, uid)):
                return
            try:
                value = self._parse(raw)
            except PARSE_ERRORS as error:
                if (uid, version) not in self._unparsable:
                    self._unparsable.add((uid, version))
                    self._report(key, version, error)
                return
            self._entries[key] = _Entry(version, uid, value)

    def replace(self, items: Iterable[Json], list_version: int) -> list[str]:
        """A full list taken at `list_version`; newer events that arrived meanwhile win.

        Returns the keys the watches had not told about (new, changed or gone): drift.
        """
        listed: dict[str, _Entry[T]] = {}
        rejected: list[tuple[str, str, int, Exception]] = []
        for raw in items:
            key, version, uid = _key(raw), _version(raw), _uid(raw)
            known = self._entries.get(key)  # unlocked: a hint only, the merge below decides
            if known is not None and known.version == version > 0 and known.uid == uid:
                listed[key] = known  # the version the cache holds: not parsed again
                continue
            try:
                listed[key] = _Entry(version, uid, self._parse(raw))
            except PARSE_ERRORS as error:
                rejected.append((key, uid, version, error))
        with self._lock:
            for key, uid, version, reason in rejected:
                if (uid, version) not in self._unparsable:
                    self._report(key, version, reason)
            # Remember only what can come again: this list's rejects and newer events' rejects.
            self._unparsable = {(uid, version) for _, uid, version, _ in rejected} | {
                (uid, version) for uid, version in self._unparsable if version > list_version
            }
            merged = {}
            for key, entry in listed.items():
                if entry.uid in self._deleted:
                    continue  # deleted after the list was taken
                current = self._entries.get(key)
                kept = current is not None and _kept(current, entry.version, entry.uid)
                merged[key] = current if current is not None and kept else entry
            for key, entry in self._entries.items():
                if key not in listed and entry.version > list_version:
                    merged[key] = entry  # created after the list was taken
            drift = sorted(
                key
                for key in merged.keys() | self._entries.keys()
                if (merged[key].version if key in merged else -1)
                != (self._entries[key].version if key in self._entries else -1)
            )
            self._entries = merged
            self._deleted = {k: v for k, v in self._deleted.items() if v > list_version}
        return drift

    def _report(self, key: str, version: int, error: Exception) -> None:
        """A rejected object version, seen for the first time: say so, and count it."""
        log.warning(
            "cache: ignoring %s %s at resourceVersion %d, which cannot be parsed: %s",
            self._kind,
            key,
            version,
            str(error)[:512],
        )
        if self._on_unparsable is not None:
            self._on_unparsable()

    def values(self) -> list[T]:
        with self._lock:
            return [entry.value for entry in self._entries.values()]
