"""What the cluster looked like when an e2e test failed, attached to the test's report (conftest's
`pytest_runtest_makereport`): a CI log then shows why a wait timed out (a pod Pending and the
scheduler's reason, a worker crash-looping and its last lines, a kube-router pod not ready) instead of
only that it did. Best effort: a command that fails adds its error, never raises."""

from __future__ import annotations

from ebbflow_devtools.kind import E2E_NAMESPACE, RELEASE_NAMESPACE, Kind, KindError

LOG_LINES = 25  # per pod: the trainer's last resumptions and steps
# Each section's tail: a cut of the whole report once dropped the nodes, pods and jobs at its head.
SECTION_CHARS = 8_000


def _section(kind: Kind, title: str, *args: str) -> str:
    try:
        body = kind.kubectl(*args, timeout=60)
    except KindError as error:
        body = f"(failed: {error})"
    body = body.rstrip()
    if len(body) > SECTION_CHARS:
        body = f"(first {len(body) - SECTION_CHARS} characters left out)\n" + body[-SECTION_CHARS:]
    return f"--- {title}: kubectl {' '.join(args)}\n{body}\n"


def cluster_state(kind: Kind) -> str:
    """Nodes, every pod, the last lines of each e2e pod's log (previous container too, when one
    restarted) and of the operator's, then the e2e namespace's jobs and latest events, kube-router's
    log and each kube-router pod's rules for the e2e namespace's pods. The logs come first: a CI
    report that shows only a report's head then still shows what the trainers last said."""
    parts = [
        _section(kind, "nodes", "get", "nodes", "-o", "wide"),
        _section(kind, "pods", "get", "pods", "-A", "-o", "wide"),
        *_pod_logs(kind),
    ]
    selector = "app.kubernetes.io/component=operator"
    operator_log = ("-n", RELEASE_NAMESPACE, "logs", "-l", selector, "--prefix", f"--tail={LOG_LINES * 2}")
    parts.append(_section(kind, "operator", *operator_log))
    parts.append(_section(kind, "jobs", "-n", E2E_NAMESPACE, "get", "elastictrainingjobs", "-o", "yaml"))
    events = ("-n", E2E_NAMESPACE, "get", "events", "--sort-by=.lastTimestamp", "-o", "wide")
    parts.append(_section(kind, "events", *events))
    # The NetworkPolicy enforcer: its syncs and errors when a job's own traffic is refused.
    enforcer_log = (
        "-n",
        "kube-system",
        "logs",
        "-l",
        "k8s-app=kube-router",
        "--prefix",
        f"--tail={LOG_LINES}",
    )
    parts.append(_section(kind, "kube-router", *enforcer_log))
    parts.extend(_policy_rules(kind))
    return "\n".join(parts)


def _pod_logs(kind: Kind) -> list[str]:
    """The last lines of each e2e pod's log, and of its previous container's when it restarted."""
    try:
        pods = kind.json("-n", E2E_NAMESPACE, "get", "pods")["items"]
    except KindError as error:
        return [f"--- e2e pods unreadable: {error}\n"]
    parts = []
    for pod in pods:
        name = pod["metadata"]["name"]
        current = ("-n", E2E_NAMESPACE, "logs", name, f"--tail={LOG_LINES}")
        parts.append(_section(kind, f"log of {name}", *current))
        restarts = sum(s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses", []))
        if restarts:
            previous = ("-n", E2E_NAMESPACE, "logs", name, "--previous", f"--tail={LOG_LINES}")
            parts.append(_section(kind, f"previous log of {name}", *previous))
    return parts


def _policy_rules(kind: Kind) -> list[str]:
    """Per node, the filter rules kube-router wrote for its pods, with their packet counts: whether
    a job's pod that cannot reach its store is refused by policy, and on which node."""
    try:
        enforcers = kind.json("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-router")["items"]
    except KindError as error:
        return [f"--- kube-router pods unreadable: {error}\n"]
    parts = []
    for enforcer in enforcers:
        name, node = enforcer["metadata"]["name"], enforcer["spec"].get("nodeName", "?")
        command = ("-n", "kube-system", "exec", name, "--", "iptables-save", "-c", "-t", "filter")
        parts.append(_section(kind, f"kube-router's rules on {node}", *command))
    return parts
