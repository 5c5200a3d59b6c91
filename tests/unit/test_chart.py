"""The Helm chart (charts/ebbflow) rendered by `helm template`: every switch, the operator's flags, the
security context, the RBAC (held to the tables below: a new verb must be added here on purpose), the
CRD (identical to crds/), the schema's refusals and the Grafana dashboard (its metric names exist).

helm comes from .tools/bin (`make tools`) or PATH. Without it the tests skip on a developer machine,
but fail under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from ebbflow_api import contract, crd
from prometheus_client import REGISTRY

Json = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ebbflow"
CHART_CRD = CHART / "files" / "crds" / Path(crd.CRD_FILE).name
DASHBOARD = CHART / "dashboards" / "ebbflow.json"
RELEASE, NAMESPACE = "ebbflow", "ebbflow-system"  # the full name is then "ebbflow"
TIMEOUT_S = 60

ALL_ON: Json = {
    "watchNamespaces": ["team-a", "team-b"],
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "dashboard": {"enabled": True},
    "operator": {"nodeSelector": {"pool": "gpu"}},
}


# --- rendering ------------------------------------------------------------------------------------


def _helm_path() -> str | None:
    pinned = ROOT / ".tools" / "bin" / "helm"
    return str(pinned) if pinned.exists() else shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    found = _helm_path()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no helm (make tools): the chart's tests cannot run in CI")
        pytest.skip("no helm on this machine (make tools)")
    return found


@cache
def _run(helm: str, command: str, values: str, extra: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """`helm <command> CHART` with `values` (JSON, which is YAML) on stdin; cached per arguments."""
    args = [helm, command]
    if command == "template":
        args += [RELEASE, "--namespace", NAMESPACE]
    args += [str(CHART), "--values", "-", *extra]
    return subprocess.run(args, input=values, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def render(helm: str, values: Json | None = None, *extra: str) -> list[Json]:
    result = _run(helm, "template", json.dumps(values or {}, sort_keys=True), extra)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kinds(docs: list[Json], kind: str) -> list[Json]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Json], kind: str, name: str | None = None) -> Json:
    found = [d for d in kinds(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def operator_container(docs: list[Json]) -> Json:
    containers: list[Json] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def args_of(docs: list[Json]) -> list[str]:
    args: list[str] = operator_container(docs)["args"]
    return args


# --- lint and schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param(ALL_ON, id="every-switch-on"),
        pytest.param(
            {
                "crds": {"install": False, "keep": False},
                "rbac": {"create": False},
                "replicas": 0,
                "trainer": {"serviceAccount": {"create": False}},
            },
            id="every-switch-off",
        ),
    ],
)
def test_helm_lint_is_clean(helm: str, values: Json) -> None:
    result = _run(helm, "lint", json.dumps(values), ("--strict",))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        pytest.param("replicas=abc", "replicas", id="replicas-not-a-number"),
        pytest.param(
            "leaderElection.enabled=false,replicas=2",
            "replicas",
            id="replicas-above-one-without-leader-election",
        ),
        pytest.param("leaderElection.enabled=maybe", "leaderElection.enabled", id="leader-election-switch"),
        pytest.param("leaderElection.leaseDuration=0", "leaderElection.leaseDuration", id="lease-zero"),
        pytest.param("image.pullPolicy=Sometimes", "image.pullPolicy", id="pull-policy-enum"),
        pytest.param("operator.logLevel=LOUD", "operator.logLevel", id="log-level-enum"),
        pytest.param("operator.policy=fastest", "operator.policy", id="policy-enum"),
        pytest.param("operator.pendingTimeout=soon", "operator.pendingTimeout", id="timer-type"),
        pytest.param("operator.resyncInterval=0", "operator.resyncInterval", id="timer-zero"),
        pytest.param("operator.healthPort=70000", "operator.healthPort", id="port-range"),
        pytest.param("watchNamespaces={Team_A}", "watchNamespaces.0", id="namespace-name"),
        pytest.param("crds.install=maybe", "crds.install", id="switch-type"),
        pytest.param("metrics.podMonitor.interval=often", "metrics.podMonitor.interval", id="interval"),
    ],
)
def test_a_wrong_value_fails_naming_it(helm: str, flag: str, value: str) -> None:
    result = _run(helm, "template", "{}", ("--set", flag))
    assert result.returncode != 0, f"--set {flag} was accepted"
    # Helm >= 3.18 names it as a JSON pointer (/operator/logLevel), older ones dotted.
    pointer = "/" + value.replace(".", "/")
    assert pointer in result.stderr or value in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flag", "name"),
    [
        pytest.param("replica=1", "replica", id="top-level"),
        pytest.param("dashboard.enable=true", "enable", id="nested"),
        pytest.param("operator.pendingTimout=5", "pendingTimout", id="misspelt-flag"),
    ],
)
def test_an_unknown_value_fails_naming_it(helm: str, flag: str, name: str) -> None:
    result = _run(helm, "template", "{}", ("--set", flag))
    assert result.returncode != 0, f"--set {flag} was accepted"
    assert "not allowed" in result.stderr and name in result.stderr, result.stderr


def schema_leaves(node: Json, prefix: str = "") -> Iterator[str]:
    """Dotted names of the schema's values: objects it describes field by field are descended."""
    if "properties" not in node:
        yield prefix
        return
    for key, child in node["properties"].items():
        yield from schema_leaves(child, f"{prefix}.{key}" if prefix else key)


def value_leaves(values: Json, schema: Json, prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        child = schema["properties"].get(key, {})
        if isinstance(value, dict) and "properties" in child:
            yield from value_leaves(value, child, name)
        else:
            yield name


def test_schema_values_and_readme_list_the_same_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    typed = set(schema_leaves(schema)) - {"global"}  # Helm's own, for subcharts
    assert typed == set(value_leaves(values, schema)), "values.yaml and values.schema.json disagree"
    readme = (CHART / "README.md").read_text()
    undocumented = sorted(name for name in typed if f"| `{name}` |" not in readme)
    assert not undocumented, f"values missing from the table in charts/ebbflow/README.md: {undocumented}"


# --- the CRD ----------------------------------------------------------------------------------------


def test_chart_crd_copy_is_byte_identical_to_crds() -> None:
    assert CHART_CRD.read_bytes() == (ROOT / crd.CRD_FILE).read_bytes(), (
        f"{CHART_CRD.relative_to(ROOT)} differs from {crd.CRD_FILE}: run `make chart-crds`"
    )


@pytest.mark.parametrize(
    ("values", "keep"),
    [
        pytest.param({}, True, id="default-keeps"),
        pytest.param({"crds": {"keep": False}}, False, id="keep-off"),
    ],
)
def test_rendered_crd_is_crds_plus_metadata(helm: str, values: Json, keep: bool) -> None:
    rendered = one(render(helm, values), "CustomResourceDefinition")
    committed = yaml.safe_load((ROOT / crd.CRD_FILE).read_text())
    metadata = rendered["metadata"]
    annotations = metadata.pop("annotations", {})
    labels = metadata.pop("labels")
    assert rendered == committed  # spec, names, versions, schema: untouched
    assert (annotations.get("helm.sh/resource-policy") == "keep") is keep
    assert labels["app.kubernetes.io/instance"] == RELEASE


@pytest.mark.parametrize(
    ("install", "count"), [pytest.param(True, 1, id="on"), pytest.param(False, 0, id="off")]
)
def test_crd_switch(helm: str, install: bool, count: int) -> None:
    docs = render(helm, {"crds": {"install": install}})
    assert len(kinds(docs, "CustomResourceDefinition")) == count


# --- the operator Deployment -------------------------------------------------------------------------


def test_deployment_defaults(helm: str) -> None:
    docs = render(helm)
    deployment = one(docs, "Deployment", RELEASE)
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2  # a leader and a warm standby
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"  # they elect a leader
    assert "--leader-elect=true" in container["args"]
    assert container["image"] == "ebbflow/operator:dev"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert "command" not in container  # the image's entrypoint: tini -- ebbflow-operator
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod["serviceAccountName"] == RELEASE
    assert one(docs, "ServiceAccount", RELEASE)["metadata"]["namespace"] == NAMESPACE
    # The key of the jobs' rendezvous tokens, from the chart's own Secret.
    key = one(docs, "Secret", f"{RELEASE}-token-key")
    assert key["metadata"]["namespace"] == NAMESPACE and len(key["data"]["key"]) >= 48
    [variable] = [e for e in container["env"] if e["name"] == "EBBFLOW_OPERATOR_TOKEN_KEY"]
    assert variable["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-token-key", "key": "key"}
    for optional in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        assert optional not in pod
    # The replicas prefer different nodes, so losing one node leaves a standby.
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )


def test_security_context(helm: str) -> None:
    docs = render(helm)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    security = container["securityContext"]
    for context in (pod["securityContext"], security):
        assert context["runAsNonRoot"] is True
        assert (context["runAsUser"], context["runAsGroup"]) == (65532, 65532)
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    [mount] = container["volumeMounts"]
    [volume] = pod["volumes"]
    assert (mount["mountPath"], mount["name"]) == ("/tmp", volume["name"])
    assert "emptyDir" in volume


@pytest.mark.parametrize("health_port", [pytest.param(8081, id="default"), pytest.param(9091, id="moved")])
def test_probes_use_kopf_healthz_on_the_health_port(helm: str, health_port: int) -> None:
    docs = render(helm, {"operator": {"healthPort": health_port}})
    container = operator_container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == health_port
    assert f"--health-port={health_port}" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_pod_placement_and_metadata_values(helm: str) -> None:
    values = {
        "replicas": 0,
        "image": {"repository": "registry.example/ebbflow/operator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/note": "x"},
        "podLabels": {"team": "ml-platform"},
        "resources": {"requests": {"cpu": "1"}},
    }
    docs = render(helm, values)
    deployment = one(docs, "Deployment")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    container = operator_container(docs)
    assert deployment["spec"]["replicas"] == 0
    assert container["image"] == "registry.example/ebbflow/operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {  # merged into the defaults, as Helm merges values
        "requests": {"cpu": "1", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert pod[key] == values[key], key
    assert template["metadata"]["annotations"] == {"example.com/note": "x"}
    assert template["metadata"]["labels"]["team"] == "ml-platform"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "name", "created"),
    [
        pytest.param({}, RELEASE, True, id="created"),
        pytest.param({"serviceAccount": {"name": "op"}}, "op", True, id="created-named"),
        pytest.param({"serviceAccount": {"create": False, "name": "op"}}, "op", False, id="existing"),
    ],
)
def test_operator_service_account(helm: str, values: Json, name: str, created: bool) -> None:
    docs = render(helm, values)
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert [
        s["metadata"]["name"] for s in kinds(docs, "ServiceAccount") if s["metadata"]["name"] == name
    ] == ([name] if created else [])
    assert one(docs, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
    ]


def test_an_existing_service_account_needs_a_name(helm: str) -> None:
    result = _run(helm, "template", json.dumps({"serviceAccount": {"create": False}}), ())
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr


# --- the operator's flags ------------------------------------------------------------------------


DEFAULT_ARGS = [
    "--pending-timeout=120",
    "--pending-hold=300",
    "--resync-interval=30",
    "--relist-interval=60",
    "--max-writes-per-pass=500",
    "--metrics-address=0.0.0.0",
    "--metrics-port=8080",
    "--health-port=8081",
    "--log-level=INFO",
    "--policy=goodput",
    "--kueue=false",
    "--leader-elect=true",
    f"--leader-election-namespace={NAMESPACE}",
    "--lease-duration=15",
    "--renew-deadline=10",
    "--retry-period=2",
]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {}, [*DEFAULT_ARGS, f"--trainer-service-account={NAMESPACE}/ebbflow-trainer"], id="defaults"
        ),
        pytest.param(
            {"watchNamespaces": ["team-a", "team-b"], "trainer": {"serviceAccount": {"create": False}}},
            ["--namespace=team-a", "--namespace=team-b", *DEFAULT_ARGS],
            id="namespaces",
        ),
        pytest.param(
            {
                "operator": {
                    "nodeSelector": {"pool": "gpu", "cloud.google.com/gke-spot": "true"},
                    "pendingTimeout": 45.5,
                    "pendingHold": 0,
                    "resyncInterval": 5,
                    "relistInterval": 600,
                    "maxWritesPerPass": 2000,
                    "metricsAddress": "::",
                    "metricsPort": 9090,
                    "healthPort": 9091,
                    "logLevel": "DEBUG",
                    "policy": "fair",
                    "kueue": True,
                },
                "leaderElection": {
                    "enabled": True,
                    "leaseDuration": 30,
                    "renewDeadline": 20,
                    "retryPeriod": 4,
                },
                "trainer": {"serviceAccount": {"create": False}},
            },
            [
                "--node-selector=cloud.google.com/gke-spot=true,pool=gpu",
                "--pending-timeout=45.5",
                "--pending-hold=0",
                "--resync-interval=5",
                "--relist-interval=600",
                "--max-writes-per-pass=2000",
                "--metrics-address=::",
                "--metrics-port=9090",
                "--health-port=9091",
                "--log-level=DEBUG",
                "--policy=fair",
                "--kueue=true",
                "--leader-elect=true",
                f"--leader-election-namespace={NAMESPACE}",
                "--lease-duration=30",
                "--renew-deadline=20",
                "--retry-period=4",
            ],
            id="every-flag-set",
        ),
    ],
)
def test_flags_rendered_into_args(helm: str, values: Json, expected: list[str]) -> None:
    assert args_of(render(helm, values)) == expected


@pytest.fixture
def operator_environment_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EBBFLOW_OPERATOR_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("operator_environment_cleared")
def test_chart_passes_every_operator_flag_with_the_operators_defaults(helm: str) -> None:
    from ebbflow_operator.__main__ import parse_args  # kopf and the client: imported here only

    defaults = vars(parse_args([]))
    every = args_of(render(helm, ALL_ON))
    passed = {arg.split("=", 1)[0].lstrip("-").replace("-", "_") for arg in every}
    assert passed == set(defaults), "a flag of `ebbflow-operator --help` has no chart value (or vice versa)"
    assert vars(parse_args(every))["namespace"] == ["team-a", "team-b"]
    rendered = vars(parse_args(args_of(render(helm))))
    trainer_accounts = rendered.pop("trainer_service_account")
    assert trainer_accounts == [(NAMESPACE, "ebbflow-trainer")]
    defaults.pop("trainer_service_account")
    # The Lease lives in the release's namespace (the operator's default: $POD_NAMESPACE, else default).
    assert rendered.pop("leader_election_namespace") == NAMESPACE
    defaults.pop("leader_election_namespace")
    # The chart runs two replicas electing a leader; the bare operator is one process and does not
    # (its tests and `make cluster-up` run several in one cluster, each on its own namespace).
    assert rendered.pop("leader_elect") is True and defaults.pop("leader_elect") is False
    assert rendered == defaults, "values.yaml's operator defaults differ from the operator's own"


# --- RBAC ------------------------------------------------------------------------------------------

Rules = dict[tuple[str, str], set[str]]

# The operator's own objects: what kube.py calls and what kopf needs (standalone, posting off).
NAMESPACED: Rules = {
    ("", "services"): {"list", "watch", "create"},
    ("networking.k8s.io", "networkpolicies"): {"list", "watch", "create"},
    ("", "secrets"): {"create"},  # the jobs' rendezvous tokens: never read
    ("", "events"): {"create"},
    (contract.API_GROUP, contract.PLURAL): {"list", "watch"},
    (contract.API_GROUP, f"{contract.PLURAL}/status"): {"patch"},
}
CRDS: Rules = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
CLUSTER_WIDE: Rules = {
    ("", "nodes"): {"list", "watch"},
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},
    **NAMESPACED,
    **CRDS,
}
LIMITED_CLUSTER: Rules = {
    ("", "nodes"): {"list", "watch"},
    ("", "pods"): {"list"},
    ("", "namespaces"): {"list", "watch"},
    **CRDS,
}
LIMITED_NAMESPACE: Rules = {("", "pods"): {"watch", "create", "delete", "patch"}, **NAMESPACED}
TRAINER: Rules = {("", "pods"): {"patch"}}


def rules_of(role: Json) -> Rules:
    table: Rules = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in table, f"{group}/{resource} in two rules"
                table[(group, resource)] = set(rule["verbs"])
    return table


def not_leader_election(objects: list[Json]) -> list[Json]:
    """RBAC objects but the leader election's Role and RoleBinding on Leases (tested on their own)."""
    return [o for o in objects if not o["metadata"]["name"].endswith("-leader-election")]


def test_rbac_every_namespace_is_one_cluster_role(helm: str) -> None:
    docs = render(helm, {"trainer": {"serviceAccount": {"create": False}}})
    assert rules_of(one(docs, "ClusterRole", RELEASE)) == CLUSTER_WIDE
    binding = one(docs, "ClusterRoleBinding", RELEASE)
    assert binding["roleRef"]["name"] == RELEASE
    assert not_leader_election(kinds(docs, "Role")) == not_leader_election(kinds(docs, "RoleBinding")) == []


def test_rbac_listed_namespaces_get_roles_and_cluster_reads_only(helm: str) -> None:
    docs = render(
        helm, {"watchNamespaces": ["team-a", "team-b"], "trainer": {"serviceAccount": {"create": False}}}
    )
    assert rules_of(one(docs, "ClusterRole", f"{RELEASE}-cluster")) == LIMITED_CLUSTER
    roles = {r["metadata"]["namespace"]: r for r in not_leader_election(kinds(docs, "Role"))}
    assert set(roles) == {"team-a", "team-b"}
    for namespace, role in roles.items():
        assert rules_of(role) == LIMITED_NAMESPACE, namespace
    bindings = {b["metadata"]["namespace"]: b for b in not_leader_election(kinds(docs, "RoleBinding"))}
    assert set(bindings) == {"team-a", "team-b"}
    for binding in bindings.values():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": RELEASE,
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]


KUEUE: Rules = {
    ("kueue.x-k8s.io", "workloads"): {"list", "watch", "create", "patch"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
    ("kueue.x-k8s.io", "localqueues"): {"list", "watch"},
}


def test_kueue_adds_rules_on_workloads_wherever_the_operator_manages_jobs(helm: str) -> None:
    docs = render(helm, {"operator": {"kueue": True}, "trainer": {"serviceAccount": {"create": False}}})
    flavors = {
        ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
        ("kueue.x-k8s.io", "clusterqueues"): {"list", "watch"},
    }
    assert rules_of(one(docs, "ClusterRole", RELEASE)) == {**CLUSTER_WIDE, **KUEUE, **flavors}
    assert "--kueue=true" in args_of(docs)
    listed = {
        "operator": {"kueue": True},
        "watchNamespaces": ["team-a"],
        "trainer": {"serviceAccount": {"create": False}},
    }
    rendered = render(helm, listed)
    [role] = not_leader_election(kinds(rendered, "Role"))
    assert rules_of(role) == {**LIMITED_NAMESPACE, **KUEUE}
    assert rules_of(one(rendered, "ClusterRole", f"{RELEASE}-cluster")) == {**LIMITED_CLUSTER, **flavors}


def test_rbac_off_creates_no_roles(helm: str) -> None:
    docs = render(helm, {"rbac": {"create": False}, "trainer": {"serviceAccount": {"create": False}}})
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert kinds(docs, kind) == [], kind


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        pytest.param({}, [NAMESPACE], id="default-release-namespace"),
        pytest.param({"watchNamespaces": ["team-a"]}, [NAMESPACE, "team-a"], id="plus-watched"),
        pytest.param(
            {"watchNamespaces": [NAMESPACE, "team-a"]}, [NAMESPACE, "team-a"], id="watched-release-once"
        ),
        pytest.param(
            {"trainer": {"rbac": {"namespaces": ["ml", "research"]}}}, ["ml", "research"], id="listed"
        ),
        pytest.param(
            {"trainer": {"serviceAccount": {"name": "runner"}, "rbac": {"namespaces": ["ml"]}}},
            ["ml"],
            id="renamed",
        ),
        pytest.param({"trainer": {"serviceAccount": {"create": False}}}, [], id="off"),
    ],
)
def test_trainer_rbac(helm: str, values: Json, namespaces: list[str]) -> None:
    docs = render(helm, values)
    name = values.get("trainer", {}).get("serviceAccount", {}).get("name", "ebbflow-trainer")
    trainer = [d for d in docs if d["metadata"]["name"] == name]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert [d["metadata"]["namespace"] for d in kinds(trainer, kind)] == namespaces, kind
    for role in kinds(trainer, "Role"):
        assert rules_of(role) == TRAINER
    for binding in kinds(trainer, "RoleBinding"):
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    flags = [a for a in args_of(docs) if a.startswith("--trainer-service-account=")]
    assert flags == [f"--trainer-service-account={n}/{name}" for n in namespaces]


# --- metrics: Service, ServiceMonitor, PodMonitor ----------------------------------------------------


def test_metrics_service_selects_the_operator_port(helm: str) -> None:
    docs = render(helm)
    service = one(docs, "Service", f"{RELEASE}-metrics")
    [port] = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 8080, "metrics")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in operator_container(docs)["ports"]}
    assert ports["metrics"] == 8080


@pytest.mark.parametrize(
    ("enabled", "count"), [pytest.param(False, 0, id="off"), pytest.param(True, 1, id="on")]
)
def test_service_monitor_switch(helm: str, enabled: bool, count: int) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": enabled, "labels": {"release": "prom"}}}}
    docs = render(helm, values)
    monitors = kinds(docs, "ServiceMonitor")
    assert len(monitors) == count
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        service = one(docs, "Service", f"{RELEASE}-metrics")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("metrics", "/metrics", True)


@pytest.mark.parametrize(
    ("values", "namespace_selector"),
    [
        pytest.param({}, None, id="off"),
        pytest.param({"metrics": {"podMonitor": {"enabled": True}}}, {"any": True}, id="every-namespace"),
        pytest.param(
            {"metrics": {"podMonitor": {"enabled": True}}, "watchNamespaces": ["team-a"]},
            {"matchNames": ["team-a"]},
            id="watched-namespaces",
        ),
    ],
)
def test_pod_monitor_switch(helm: str, values: Json, namespace_selector: Json | None) -> None:
    monitors = kinds(render(helm, values), "PodMonitor")
    if namespace_selector is None:
        assert monitors == []
        return
    [monitor] = monitors
    spec = monitor["spec"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert spec["selector"] == {"matchLabels": {contract.LABEL_ROLE: contract.ROLE_WORKER}}
    assert spec["jobLabel"] == contract.LABEL_JOB_NAME
    assert spec["namespaceSelector"] == namespace_selector
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    addresses = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__"]
    replacements = [r["replacement"] for r in addresses]
    assert replacements == [f"${{1}}:{contract.METRICS_PORT}", f"[${{1}}]:{contract.METRICS_PORT}"]
    ipv4, ipv6 = (re.compile(r["regex"]) for r in addresses)
    assert ipv4.fullmatch("10.1.2.3") and not ipv4.fullmatch("fd00::1")
    assert ipv6.fullmatch("fd00::1") and not ipv6.fullmatch("10.1.2.3")


# --- the Grafana dashboard -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "count"), [pytest.param(False, 0, id="off"), pytest.param(True, 1, id="on")]
)
def test_dashboard_switch(helm: str, enabled: bool, count: int) -> None:
    maps = kinds(render(helm, {"dashboard": {"enabled": enabled}}), "ConfigMap")
    assert len(maps) == count
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(config_map["data"]["ebbflow.json"]) == json.loads(DASHBOARD.read_text())


def dashboard() -> Json:
    loaded: Json = json.loads(DASHBOARD.read_text())
    return loaded


def expressions() -> Iterator[str]:
    """Every PromQL expression: the panels' targets and the query variables'."""
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            yield target["expr"]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def test_dashboard_structure() -> None:
    board = dashboard()
    assert board["schemaVersion"] == 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no target"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"panel {panel['title']!r} has an empty expression"
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def exposed_metric_names() -> set[str]:
    """The series names the operator's and the trainer's metrics modules expose."""
    import ebbflow_trainer.metrics  # noqa: F401  (registers the trainer's metrics in REGISTRY)
    from ebbflow_operator.metrics import Metrics

    families = [*Metrics().registry.collect(), *REGISTRY.collect()]
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in families
        if family.name.startswith("ebbflow_")
        for suffix in suffixes.get(family.type, ())
    }


def test_dashboard_uses_only_metrics_that_exist() -> None:
    exposed = exposed_metric_names()
    used = {name for expr in expressions() for name in re.findall(r"\bebbflow_[a-z0-9_]+", expr)}
    assert used, "no ebbflow_ metric found in the dashboard"
    unknown = sorted(used - exposed)
    assert not unknown, (
        f"the dashboard queries series no metrics module exposes: {unknown} "
        "(defined in operator/ebbflow_operator/metrics.py and trainer-image/ebbflow_trainer/metrics.py)"
    )
    # Each module is queried at least once, so the panels cover both sides.
    assert any(n.startswith("ebbflow_trainer_") for n in used)
    assert any(not n.startswith("ebbflow_trainer_") for n in used)


# --- NOTES.txt -----------------------------------------------------------------------------------------


NOTES_CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: notes}
data: {notes: {{ include "notes" . | quote }}}
"""


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, ["every namespace", f"-n {NAMESPACE} get etj -w", "keeps the CRD"], id="defaults"),
        pytest.param(
            {"watchNamespaces": ["team-a"], "crds": {"keep": False}},
            ["in team-a.", "-n team-a apply -f examples/jobs/digits.yaml", f"in: {NAMESPACE}, team-a"],
            id="namespaces",
        ),
    ],
)
def test_notes_render(helm: str, tmp_path: Path, values: Json, expected: list[str]) -> None:
    """`helm template` skips NOTES.txt: a copy of the chart renders it inside a ConfigMap."""
    chart = tmp_path / "ebbflow"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_test.tpl").write_text(f'{{{{- define "notes" -}}}}{notes}{{{{- end }}}}')
    (chart / "templates" / "notes_test.yaml").write_text(NOTES_CONFIG_MAP)
    command = [helm, "template", RELEASE, str(chart), "-n", NAMESPACE, "-s", "templates/notes_test.yaml"]
    result = subprocess.run(
        [*command, "--values", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    text = yaml.safe_load(result.stdout)["data"]["notes"]
    for fragment in expected:
        assert fragment in text, f"{fragment!r} not in NOTES:\n{text}"
    assert ("keeps the CRD" in text) is values.get("crds", {}).get("keep", True)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, True, id="defaults-two-replicas"),
        pytest.param({"replicas": 3}, True, id="three-replicas"),
        pytest.param({"replicas": 1}, False, id="one-replica"),
        pytest.param({"podDisruptionBudget": {"enabled": False}}, False, id="switched-off"),
    ],
)
def test_a_disruption_budget_keeps_one_operator_through_a_drain(
    helm: str, values: Json, expected: bool
) -> None:
    docs = render(helm, values)
    budgets = kinds(docs, "PodDisruptionBudget")
    assert bool(budgets) is expected
    if budgets:
        [budget] = budgets
        assert budget["metadata"]["namespace"] == NAMESPACE
        assert budget["spec"]["maxUnavailable"] == 1
        deployment = one(docs, "Deployment")
        assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_leader_election_runs_replicas_with_a_lease_role_in_the_release_namespace(helm: str) -> None:
    docs = render(helm, {"replicas": 2, "leaderElection": {"enabled": True}})
    [deployment] = kinds(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--leader-elect=true" in args_of(docs)
    [role] = [r for r in kinds(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules_of(role) == {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
    [binding] = [b for b in kinds(docs, "RoleBinding") if b["metadata"]["name"] == role["metadata"]["name"]]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    off = render(helm, {"replicas": 1, "leaderElection": {"enabled": False}})
    assert "--leader-elect=false" in args_of(off)
    assert not [r for r in kinds(off, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert kinds(off, "Deployment")[0]["spec"]["strategy"]["type"] == "Recreate"
