"""Deaths the operator declares: an authenticated endpoint in the rendezvous pod that removes a pod's
node from the job's rendezvous at once, as its own leave would.

The operator sees a worker pod fail or its node go within a watch event; the survivors may see
nothing (a vanished host answers no probe, so :mod:`.liveness` has no evidence). It POSTs the pods
to ``/v1/gone`` on the rendezvous pod with the job's token (``Authorization: Bearer``), and for each
pod this process looks up the node its launcher published (:func:`pod_key`); a member of the round
gets its departure from the newest generation recorded with the operator's evidence
(:func:`.membership.departure_key`), and leaves the round (or the wait list, a newcomer) as its own
exit would (:class:`DeclaredGoneOp`, run on its behalf). The survivors then re-form as after a
graceful leave: their poll sees a member gone, their next round knows its members.

Invariants: nothing is removed without the job's token (compared in constant time); only nodes that
this job's launchers published can be named; a declaration repeated, or of a node already gone, is
a no-op; this process never removes a node for its heartbeats (its own heartbeat budget is endless).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ebbflow_api import contract

# torch re-exports Store from a C extension without declaring it public to type checkers.
from torch.distributed import Store  # type: ignore[attr-defined]
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

from ebbflow_trainer.config import ConfigError
from ebbflow_trainer.launch import membership

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
REMOVE_TIMEOUT_S = 10.0  # for torch's exit operation to sync the state with the store
# What a declaration did to each pod named (the response's values).
REMOVED, NOT_A_MEMBER, UNKNOWN_POD = "removed", "not a member", "unknown pod"


def pod_key(pod: str) -> str:
    """The store key holding the node (torch's node descriptor, as text) of the launcher in `pod`."""
    return f"ebbflow/pod/{pod}"


class BadDeclaration(ValueError):
    """A request body that is not a declaration (the message names the field and the shape)."""


def parse_declaration(body: bytes) -> dict[str, str]:
    """The pods a request body declares gone, with the evidence for each:
    ``{"pods": {"<pod name>": "<evidence>", ...}}``."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadDeclaration(
            f'the body is not JSON ({error}): send {{"pods": {{name: evidence}}}}'
        ) from error
    pods = document.get("pods") if isinstance(document, dict) else None
    if not isinstance(pods, dict) or not pods:
        raise BadDeclaration('"pods" must be a non-empty object of pod name to evidence')
    if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in pods.items()):
        raise BadDeclaration('"pods" must map pod names to evidence, both strings')
    return dict(pods)


def authorized(header: str | None, token: str) -> bool:
    """Whether an Authorization header carries `token` as a bearer token (constant-time compare)."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())


def parse_node(text: str) -> dynamic_rendezvous._NodeDesc:
    """Torch's node descriptor from its text (``addr_pid_localid``; the address may hold ``_``)."""
    addr, pid, local_id = text.rsplit("_", 2)
    return dynamic_rendezvous._NodeDesc(addr, int(pid), int(local_id))


@dataclass(frozen=True)
class Rendezvous:
    """Which rendezvous a declaration acts on: the job's run id and its node bounds."""

    run_id: str
    min_nodes: int
    max_nodes: int


@dataclass(frozen=True)
class EndpointSettings:
    """The endpoint's port, the job's token and its rendezvous (the rendezvous pod's environment)."""

    port: int
    token: str
    rendezvous: Rendezvous


def settings_from_environment(env: Mapping[str, str]) -> EndpointSettings | None:
    """The endpoint's settings; None without a token (a job created before the endpoint existed, or a
    rendezvous outside Kubernetes). Raises ConfigError naming a variable that is set but invalid."""
    token = env.get(contract.ENV_RDZV_TOKEN, "")
    if not token:
        return None
    values: dict[str, int] = {}
    defaults = {contract.ENV_DECLARATIONS_PORT: contract.DECLARATIONS_PORT, contract.ENV_MIN_REPLICAS: 1}
    for name in (contract.ENV_DECLARATIONS_PORT, contract.ENV_MIN_REPLICAS, contract.ENV_MAX_REPLICAS):
        raw = env.get(name, "") or str(defaults.get(name, ""))
        if not raw.isdigit():
            raise ConfigError(
                f"{name}={raw!r}: set it to a whole number (the operator sets it on the rendezvous pod)"
            )
        values[name] = int(raw)
    rendezvous = Rendezvous(
        env.get(contract.ENV_RDZV_ID, ""),
        values[contract.ENV_MIN_REPLICAS],
        values[contract.ENV_MAX_REPLICAS],
    )
    if not rendezvous.run_id:
        raise ConfigError(
            f"{contract.ENV_RDZV_ID} is not set: set it to the job's rendezvous id (the job's uid)"
        )
    return EndpointSettings(values[contract.ENV_DECLARATIONS_PORT], token, rendezvous)


class Remover:
    """Removes declared pods' nodes from the job's rendezvous through a store client of its own."""

    def __init__(self, store: Store, rendezvous: Rendezvous) -> None:
        self._store = store
        self._lock = threading.Lock()  # one declaration at a time over the one client
        endless = timedelta(days=3650)  # never expire anyone's heartbeats here: the launchers do
        self._settings = dynamic_rendezvous.RendezvousSettings(
            run_id=rendezvous.run_id,
            min_nodes=rendezvous.min_nodes,
            max_nodes=rendezvous.max_nodes,
            timeout=RendezvousTimeout(heartbeat=endless),
            keep_alive_interval=endless,
            keep_alive_max_attempt=1,
        )
        self._backend = C10dRendezvousBackend(store, rendezvous.run_id)

    def declare(self, pods: Mapping[str, str]) -> dict[str, str]:
        """Remove each pod's node (pod -> evidence); what became of each pod."""
        with self._lock:
            return {pod: self._declare_one(pod, evidence) for pod, evidence in pods.items()}

    def _declare_one(self, pod: str, evidence: str) -> str:
        if not self._store.check([pod_key(pod)]):
            return UNKNOWN_POD
        text = self._store.get(pod_key(pod)).decode()
        node = parse_node(text)
        holder = dynamic_rendezvous._BackendRendezvousStateHolder(
            self._backend, self._settings, cache_duration=0
        )
        holder.sync()
        state = holder.state
        if node not in state.participants and node not in state.wait_list:
            return NOT_A_MEMBER
        if node in state.participants:  # a member of the newest world: its departure says why
            generation = int(self._store.add(membership.GENERATION_COUNTER, 0))
            key = membership.departure_key(generation, text)
            self._store.compare_set(key, "", membership.GONE_PREFIX + f"declared by the operator: {evidence}")
        executor = dynamic_rendezvous._DistributedRendezvousOpExecutor(node, holder, self._settings)
        executor.run(DeclaredGoneOp(), time.monotonic() + REMOVE_TIMEOUT_S)
        log.warning("pod %s (node %s) declared gone by the operator: %s", pod, text, evidence)
        return REMOVED


class DeclaredGoneOp:
    """Torch's exit operation run for a node that cannot run it: out of the round's participants, as
    its own leave would take it, or off the wait list of a node that was waiting to join."""

    def __call__(
        self, ctx: dynamic_rendezvous._RendezvousContext, deadline: float
    ) -> dynamic_rendezvous._Action:
        if ctx.node not in ctx.state.participants and ctx.node not in ctx.state.wait_list:
            return dynamic_rendezvous._Action.FINISH
        if time.monotonic() > deadline:
            return dynamic_rendezvous._Action.ERROR_TIMEOUT
        if ctx.node in ctx.state.participants:
            return dynamic_rendezvous._Action.REMOVE_FROM_PARTICIPANTS
        return dynamic_rendezvous._Action.REMOVE_FROM_WAIT_LIST


class DeclarationEndpoint:
    """The HTTP endpoint, served by a thread until `close`."""

    def __init__(self, port: int, token: str, remover: Remover) -> None:
        handler = _handler_class(token, remover)
        self._server = ThreadingHTTPServer(("", port), handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="declarations", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_class(token: str, remover: Remover) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != contract.DECLARATIONS_PATH:
                self._answer(404, {"error": f"no such path: POST {contract.DECLARATIONS_PATH}"})
                return
            if not authorized(self.headers.get("Authorization"), token):
                self._answer(401, {"error": "Authorization must be 'Bearer <the job's rendezvous token>'"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, {"error": f"a declaration is at most {MAX_BODY_BYTES} bytes"})
                return
            try:
                pods = parse_declaration(self.rfile.read(length))
            except BadDeclaration as error:
                self._answer(400, {"error": str(error)})
                return
            self._answer(200, remover.declare(pods))

        def _answer(self, status: int, document: Mapping[str, str]) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("declarations: " + format, *args)

    return Handler
