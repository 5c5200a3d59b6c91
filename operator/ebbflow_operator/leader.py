"""Leader election on a `coordination.k8s.io/v1` Lease, so that several operator replicas can run
and exactly one of them acts (the others keep their watches and caches warm and take over).

Each replica decides anew at every tick from the Lease it reads and its clock (`next_action`):

    no Lease                                   -> CREATE     (this replica leads)
    held by this replica                       -> RENEW
    held by another, renewed < duration ago    -> STAND_BY
    held by nobody, or its renewal expired     -> TAKE_OVER  (leaseTransitions + 1)

Invariants: writes carry the resourceVersion read, so of two replicas racing for one Lease the loser's
write is refused (409); a leader stops acting once `renew_deadline` (shorter than the lease duration)
has passed since its last renewal, before any other replica may take the Lease (clocks assumed to
agree to well within that margin, as client-go assumes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from .decision.model import Json
from .errors import KubeError

log = logging.getLogger(__name__)

LEASE_NAME = "ebbflow-operator"


class LeaseAction(StrEnum):
    CREATE = "create"
    RENEW = "renew"
    STAND_BY = "stand-by"
    TAKE_OVER = "take-over"


@dataclass(frozen=True)
class Lease:
    """What the election reads of a Lease object."""

    holder: str | None
    renewed_at: float | None  # epoch seconds
    duration_seconds: float
    transitions: int = 0
    resource_version: str | None = None


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    identity: str
    name: str = LEASE_NAME
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period:g} / {self.renew_deadline:g} / {self.lease_duration:g} s"
            )


def next_action(lease: Lease | None, identity: str, now: float) -> LeaseAction:
    """The table in the module docstring."""
    if lease is None:
        return LeaseAction.CREATE
    if lease.holder == identity:
        return LeaseAction.RENEW
    expired = lease.renewed_at is None or now - lease.renewed_at >= lease.duration_seconds
    if lease.holder and not expired:
        return LeaseAction.STAND_BY
    return LeaseAction.TAKE_OVER


def leads(last_renewal: float | None, now: float, renew_deadline: float) -> bool:
    """Whether a replica may act: it renewed its Lease less than `renew_deadline` ago."""
    return last_renewal is not None and now - last_renewal < renew_deadline


def parse_lease(raw: Json) -> Lease:
    spec = raw.get("spec") or {}
    renewed = spec.get("renewTime")
    return Lease(
        holder=spec.get("holderIdentity") or None,
        renewed_at=datetime.fromisoformat(renewed).timestamp() if renewed else None,
        duration_seconds=float(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=raw.get("metadata", {}).get("resourceVersion"),
    )


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(config: ElectionConfig, action: LeaseAction, current: Lease | None, now: float) -> Json:
    """The Lease to write for `action` (not STAND_BY): this replica as holder, renewed now."""
    transitions = current.transitions if current is not None else 0
    if action is LeaseAction.TAKE_OVER:
        transitions += 1
    metadata: Json = {"name": config.name, "namespace": config.namespace}
    if current is not None and current.resource_version:
        metadata["resourceVersion"] = current.resource_version
    spec: Json = {
        "holderIdentity": config.identity,
        "leaseDurationSeconds": int(config.lease_duration),
        "renewTime": _micro_time(now),
        "leaseTransitions": transitions,
    }
    if action is not LeaseAction.RENEW:
        spec["acquireTime"] = _micro_time(now)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


class LeaseIO(Protocol):
    """Reads and writes one Lease; KubeIO implements it. Failures raise KubeError."""

    def read_lease(self, namespace: str, name: str) -> Json | None: ...
    def create_lease(self, namespace: str, body: Json) -> Json: ...
    def replace_lease(self, namespace: str, name: str, body: Json) -> Json: ...


class Elector:
    """Runs the election every retry period in its own thread; `leading()` gates the operator."""

    def __init__(
        self,
        io: LeaseIO,
        config: ElectionConfig,
        on_change: Callable[[bool], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.io, self.config, self.on_change, self.clock = io, config, on_change, clock
        self._last_renewal: float | None = None
        self._was_leading = False

    def leading(self) -> bool:
        return leads(self._last_renewal, self.clock(), self.config.renew_deadline)

    def tick(self) -> LeaseAction | None:
        """One round: read, decide, write. Returns the action taken, None when a write failed."""
        config, now = self.config, self.clock()
        try:
            raw = self.io.read_lease(config.namespace, config.name)
            current = parse_lease(raw) if raw is not None else None
            action = next_action(current, config.identity, now)
            if action is LeaseAction.CREATE:
                self.io.create_lease(config.namespace, lease_body(config, action, None, now))
            elif action is not LeaseAction.STAND_BY:
                self.io.replace_lease(config.namespace, config.name, lease_body(config, action, current, now))
        except KubeError as error:  # 409: another replica wrote first; anything else: try again
            log.log(logging.INFO if error.status == 409 else logging.WARNING, "lease: %s", error)
            self._note_leadership()
            return None
        if action is not LeaseAction.STAND_BY:
            self._last_renewal = now
        elif current is not None and current.holder != config.identity:
            self._last_renewal = None
        self._note_leadership()
        return action

    def _note_leadership(self) -> None:
        leading = self.leading()
        if leading != self._was_leading:
            self._was_leading = leading
            verb = "acquired" if leading else "gave up"
            log.info(
                "%s %s leadership (lease %s/%s)",
                self.config.identity,
                verb,
                self.config.namespace,
                self.config.name,
            )
            self.on_change(leading)

    def release(self) -> None:
        """On shutdown: stop leading now and hand the Lease back, so a standby takes over at its next
        tick instead of waiting out the lease duration."""
        if not self.leading():
            return
        self._last_renewal = None
        self._note_leadership()
        config = self.config
        try:
            raw = self.io.read_lease(config.namespace, config.name)
            current = parse_lease(raw) if raw is not None else None
            if current is not None and current.holder == config.identity:
                body = lease_body(config, LeaseAction.RENEW, current, self.clock())
                body["spec"]["holderIdentity"] = None
                self.io.replace_lease(config.namespace, config.name, body)
        except KubeError as error:
            log.warning("lease not released (a standby takes over when it expires): %s", error)

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.tick()
            stop.wait(self.config.retry_period)
        self.release()
