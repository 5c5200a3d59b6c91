"""`ebbflow-operator` / `python -m ebbflow_operator`: the operator process.

Every option also reads an EBBFLOW_OPERATOR_* environment variable, for deployments that configure
the operator through its container's environment rather than its arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import socket
import threading
from collections.abc import Sequence

import kopf
from kubernetes import client, config

from . import handlers
from .decision.plan import PlannerConfig
from .declarer import random_key
from .kube import KubeIO
from .leader import ElectionConfig, Elector
from .metrics import Metrics
from .policies import POLICIES
from .reconciler import OperatorConfig, Reconciler

ENV_PREFIX = "EBBFLOW_OPERATOR_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def _selector(text: str) -> dict[str, str]:
    """`key=value[,key=value]` -> dict."""
    selector = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value, got {part!r}")
        selector[key] = value
    return selector


# A ServiceAccount name (DNS-1123 subdomain) and a namespace name (DNS-1123 label).
_ACCOUNT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _service_account(text: str) -> tuple[str, str]:
    """`[namespace/]name` -> (namespace, name); namespace "" means every namespace."""
    namespace, _, name = text.strip().rpartition("/")
    if not _ACCOUNT_NAME.match(name) or (namespace and not _NAMESPACE_NAME.match(namespace)):
        raise argparse.ArgumentTypeError(f"expected [namespace/]serviceaccount, got {text!r}")
    return namespace, name


_PLANNER, _OPERATOR = PlannerConfig(), OperatorConfig()
# Timers in seconds: flag, environment variable suffix, default (from the config classes), help.
_TIMERS = (
    (
        "--pending-timeout",
        "PENDING_TIMEOUT",
        _PLANNER.pending_timeout,
        "seconds the scheduler may refuse a worker before it is withdrawn",
    ),
    (
        "--pending-hold",
        "PENDING_HOLD",
        _PLANNER.hold_seconds,
        "after a withdrawal the job does not grow for this many seconds",
    ),
    (
        "--resync-interval",
        "RESYNC_INTERVAL",
        _OPERATOR.resync_interval,
        "seconds between passes when no watch event arrives",
    ),
    (
        "--relist-interval",
        "RELIST_INTERVAL",
        _OPERATOR.relist_interval,
        "seconds between full lists of nodes, pods, jobs and Services (longer when a list takes over "
        "5 %% of it: 20 times its duration); watches keep the operator's view current in between",
    ),
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ebbflow-operator", description="Resizes ElasticTrainingJob workers as GPU capacity changes."
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[n for n in _env("NAMESPACES", "").split(",") if n],
        help="watch only this namespace (repeatable; env EBBFLOW_OPERATOR_NAMESPACES=a,b); default: all",
    )
    parser.add_argument(
        "--node-selector",
        type=_selector,
        default=_selector(_env("NODE_SELECTOR", "")),
        help="allocate only nodes with these labels, key=value[,key=value] (env ..._NODE_SELECTOR)",
    )
    for flag, variable, default, text in _TIMERS:
        parser.add_argument(
            flag,
            type=float,
            default=float(_env(variable, str(default))),
            help=f"{text} (default {default:g}; env {ENV_PREFIX}{variable})",
        )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "8080")),
        help="port of /metrics; 0 turns it off (default 8080)",
    )
    parser.add_argument("--metrics-address", default=_env("METRICS_ADDRESS", "0.0.0.0"))
    parser.add_argument(
        "--health-port",
        type=int,
        default=int(_env("HEALTH_PORT", "8081")),
        help="port of kopf's liveness endpoint /healthz (on --metrics-address); 0 turns it off "
        "(default 8081)",
    )
    parser.add_argument(
        "--max-writes-per-pass",
        type=_at_least_one,
        default=_at_least_one(_env("MAX_WRITES_PER_PASS", str(_OPERATOR.max_writes_per_pass))),
        help="API writes one pass applies at most; the other jobs' plans wait for the next pass, which "
        f"runs at once (default {_OPERATOR.max_writes_per_pass}; env {ENV_PREFIX}MAX_WRITES_PER_PASS)",
    )
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--trainer-service-account",
        metavar="[NAMESPACE/]NAME",
        type=_service_account,
        action="append",
        default=[_service_account(a) for a in _env("TRAINER_SERVICE_ACCOUNT", "").split(",") if a],
        help="ServiceAccount of worker pods whose template sets none, in NAMESPACE or, without one, in "
        "every namespace (repeatable; env EBBFLOW_OPERATOR_TRAINER_SERVICE_ACCOUNT=a/x,b/x); it must "
        "exist there and may patch pods, for the trainer's progress annotation; default: the "
        "namespace's default account",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default=_env("POLICY", _OPERATOR.policy),
        help="who gets a freed GPU: fair (priority, then max-min fair share), goodput (Pollux: the "
        "GPUs that speed jobs up most, from the trainers' measured step times) or quality (SLAQ: "
        f"the largest predicted loss reduction) (default {_OPERATOR.policy}; env {ENV_PREFIX}POLICY)",
    )
    parser.add_argument(
        "--kueue",
        type=_boolean,
        default=_boolean(_env("KUEUE", "false")),
        help="jobs labeled kueue.x-k8s.io/queue-name run only what Kueue admits, through Workloads the "
        "operator creates (needs Kueue with ElasticJobsViaWorkloadSlices; env EBBFLOW_OPERATOR_KUEUE) "
        "(default false)",
    )
    _election_arguments(parser)
    return parser.parse_args(argv)


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _election_arguments(parser: argparse.ArgumentParser) -> None:
    election = ElectionConfig(namespace="", identity="")
    parser.add_argument(
        "--leader-elect",
        type=_boolean,
        default=_boolean(_env("LEADER_ELECT", "false")),
        metavar="true|false",
        help="act only while holding the Lease, so that several replicas can run (default false; "
        "env EBBFLOW_OPERATOR_LEADER_ELECT)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=_env("LEADER_ELECTION_NAMESPACE", os.environ.get("POD_NAMESPACE", "default")),
        help="namespace of the Lease (default: $POD_NAMESPACE, else default)",
    )
    for flag, value, text in (
        (
            "--lease-duration",
            election.lease_duration,
            "a standby takes over a Lease not renewed for this long",
        ),
        (
            "--renew-deadline",
            election.renew_deadline,
            "the leader stops acting when it could not renew for this long",
        ),
        ("--retry-period", election.retry_period, "seconds between election rounds"),
    ):
        variable = flag.removeprefix("--").replace("-", "_").upper()
        parser.add_argument(
            flag, type=float, default=float(_env(variable, str(value))), help=f"{text} (default {value:g} s)"
        )


def _elector(args: argparse.Namespace, io: KubeIO) -> Elector | None:
    if not args.leader_elect:
        return None
    try:
        config = ElectionConfig(
            namespace=args.leader_election_namespace,
            identity=f"{socket.gethostname()}-{secrets.token_hex(4)}",
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as error:
        raise SystemExit(f"ebbflow-operator: {error}") from error
    return Elector(io, config)


def _token_key() -> bytes:
    """The key the jobs' rendezvous tokens are signed with (declarer.py), from the environment (the
    chart's Secret); without one, a random key, so the tokens change when the operator restarts."""
    key = _env("TOKEN_KEY", "")
    if key:
        return key.encode()
    logging.getLogger(__name__).warning(
        "%sTOKEN_KEY is not set: the jobs' rendezvous tokens change when the operator restarts, and "
        "a job started before then waits out a dead worker's heartbeats (the Helm chart sets it)",
        ENV_PREFIX,
    )
    return random_key()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("kopf").setLevel(logging.WARNING)  # one line per watch event otherwise
    # The HTTP clients' debug lines (every request, every response body) would bury the operator's
    # own (a line per plan applied) and slow it down at scale.
    for library in ("urllib3", "kubernetes"):
        logging.getLogger(library).setLevel(max(logging.INFO, logging.getLogger().level))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 16
    operator_config = OperatorConfig(
        namespaces=tuple(args.namespace),
        node_selector=args.node_selector,
        planner=PlannerConfig(
            pending_timeout=args.pending_timeout,
            hold_seconds=args.pending_hold,
            trainer_service_accounts=dict(args.trainer_service_account),
        ),
        resync_interval=args.resync_interval,
        relist_interval=args.relist_interval,
        max_writes_per_pass=args.max_writes_per_pass,
        policy=args.policy,
        kueue=args.kueue,
    )
    if args.kueue:
        handlers.watch_kueue()
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    count = metrics.api_requests
    io = KubeIO(
        client.ApiClient(configuration),
        operator_config.namespaces,
        on_request=lambda verb, resource: count.labels(verb, resource).inc(),
    )
    elector = _elector(args, io)
    leading = elector.leading if elector else lambda: True
    reconciler = Reconciler(io, operator_config, metrics, leading=leading, token_key=_token_key())
    stop = threading.Event()
    threads = [
        threading.Thread(target=reconciler.run_forever, args=(stop,), name="ebbflow-reconcile", daemon=True)
    ]
    if elector is not None:

        def leadership_changed(leading: bool) -> None:
            metrics.leader.set(int(leading))
            reconciler.trigger()  # the new leader's first pass (a relist) starts now

        elector.on_change = leadership_changed
        threads.append(
            threading.Thread(target=elector.run_forever, args=(stop,), name="ebbflow-lease", daemon=True)
        )
    else:
        metrics.leader.set(1)
    for thread in threads:
        thread.start()
    try:
        health = f"http://{args.metrics_address}:{args.health_port}/healthz" if args.health_port else None
        kopf.run(
            liveness_endpoint=health,
            standalone=True,
            clusterwide=not operator_config.namespaces,
            namespaces=operator_config.namespaces,
            memo=kopf.Memo(reconciler=reconciler),
        )
    finally:
        stop.set()
        reconciler.trigger()
        for thread in threads:
            thread.join(timeout=10)


if __name__ == "__main__":
    main()
