"""The kind cluster built on this machine (hack/kind), driven from Python for the e2e tier, the
demo and the benchmarks: bring it up with the project's images and the fake GPU device plugin,
install the operator's chart, and take worker nodes away and back the way a cloud does.

Everything that changes the cluster goes through the same command-line tools a user runs (`kubectl`,
`kind`, `helm`, the scripts under hack/), with the tools from .tools/bin and hack/kind/bin's docker
shim on PATH; the reads a wait repeats go through `Kind.api`, in this process. A failing command or
read raises `KindError` with its stderr or answer; nothing here retries.

`python -m ebbflow_devtools.kind` sets the e2e cluster up as the e2e fixture does (CI
does it beside the other tiers, hack/ci-prepare-e2e.sh); the fixture's own call then takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import yaml
from ebbflow_api.contract import API_GROUP

from ebbflow_devtools import kueue_cluster, object_store
from ebbflow_devtools.api_reads import ApiReader
from ebbflow_devtools.errors import KindError as KindError  # re-exported: callers import it from here
from ebbflow_devtools.waiting import NotYet, wait_for

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools" / "bin"
KUBECONFIG = REPO / ".cluster" / "kind-kubeconfig"
# The host's side of every worker's /shared (hack/kind/up.sh); hostPath volumes live under volumes/.
SHARED_VOLUMES = Path(os.environ.get("KIND_SHARED_DIR") or REPO / ".cluster" / "shared") / "volumes"
CLUSTER = "ebbflow"
WORKERS = (f"{CLUSTER}-worker", f"{CLUSTER}-worker2", f"{CLUSTER}-worker3")
CONTROL_PLANE = f"{CLUSTER}-control-plane"
TRAINER_IMAGE = "ebbflow/trainer:dev-cpu"
OPERATOR_IMAGE = "ebbflow/operator:dev"
GPUS_PER_WORKER_NODE = 4  # the plugin's default: 2 physical devices x 2 time-slicing replicas
RELEASE, RELEASE_NAMESPACE = "ebbflow", "ebbflow-system"
OPERATOR_DEPLOYMENT = RELEASE  # the chart's fullname for a release named like the chart
# Where the demo and the e2e tier run jobs: the chart gives their workers the trainers'
# ServiceAccount (progress annotation) there. One installation serves both.
DEMO_NAMESPACE, E2E_NAMESPACE = "ebbflow-demo", "ebbflow-e2e"
RESTRICTED_POD_SECURITY = {"pod-security.kubernetes.io/enforce": "restricted"}
# What a pod needs to be admitted there (the trainer image runs as its user 65532).
RESTRICTED_POD_CONTEXT = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# A read through kubectl starts a process (0.12 s of CPU under CI's load, measured, and a TLS handshake
# with the API server; through `Kind.api` 0.002 s): the e2e tier's own process used about a quarter of
# CI's two cores polling through kubectl once a second (docs/ci.md, run Q). What the e2e tier and the
# demo wait for takes seconds to minutes.
KUBECTL_POLL_S = 2.0
CHART_VALUES = (
    f"trainer.rbac.namespaces={{{DEMO_NAMESPACE},{E2E_NAMESPACE}}}",
    "operator.resyncInterval=5",
    # Fair share hands every free GPU out, so the demo and the scenarios see each resize they cause.
    # The default, goodput, grows a job only where its trainers' measured step times say a worker
    # pays, which on kind nodes sharing a machine's few cores depends on that machine's load.
    "operator.policy=fair",
    # Scraped by the Prometheus Operator's Prometheus (hack/prometheus-operator), every 5 s.
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.interval=5s",
    "metrics.podMonitor.enabled=true",
    "metrics.podMonitor.interval=5s",
)
# The e2e tier's cluster also runs Kueue (hack/kueue), and the operator's integration with it: jobs
# labeled with a LocalQueue run within its quota, every other job as without it.
E2E_CHART_VALUES = (*CHART_VALUES, "operator.kueue=true")
# A node taken away carries this NoExecute taint until its Node object is deleted.
TAKEN_AWAY_TAINT = "ebbflow.dev/taken-away"
PROMETHEUS_NAMESPACE = "monitoring"  # hack/prometheus-operator/deploy.yaml
SETUP_TIMEOUT_S = 3600


def environment() -> dict[str, str]:
    """PATH with the project's tools and the docker shim; the kind kubeconfig; the CPU trainer only."""
    path = f"{REPO / 'hack' / 'kind' / 'bin'}:{TOOLS}:{os.environ['PATH']}"
    # The kind nodes run the CPU trainer image; the CUDA one (1.7 GB more) is not built for them.
    variants = os.environ.get("TRAINER_VARIANTS", "cpu")
    return {**os.environ, "PATH": path, "KUBECONFIG": str(KUBECONFIG), "TRAINER_VARIANTS": variants}


def run(*command: str, input: str | None = None, timeout: float = SETUP_TIMEOUT_S) -> str:
    """Run a command in the repository with `environment()`; its stdout, or KindError."""
    try:
        result = subprocess.run(
            command, env=environment(), input=input, capture_output=True, text=True, timeout=timeout, cwd=REPO
        )
    except subprocess.TimeoutExpired as error:
        raise KindError(f"{' '.join(command)} did not finish within {timeout:.0f} s") from error
    if result.returncode != 0:
        raise KindError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


T = TypeVar("T")


def poll(condition: Callable[[], T | NotYet | None], timeout: float, what: str) -> T:
    """`wait_for` for a condition read through kubectl: checked every KUBECTL_POLL_S seconds."""
    return wait_for(condition, timeout, what, interval=KUBECTL_POLL_S)


@dataclass
class Kind:
    """kubectl, helm and docker against the kind cluster."""

    log: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        return run("kubectl", *args, input=input, timeout=timeout)

    @cached_property
    def api(self) -> ApiReader:
        """Reads without a kubectl process each (the polls): made on first use, once the cluster's
        kubeconfig exists."""
        return ApiReader(KUBECONFIG)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def node_names(self) -> set[str]:
        return {n["metadata"]["name"] for n in self.json("get", "nodes")["items"]}

    def query(self, expression: str) -> list[dict[str, Any]]:
        """A PromQL instant query against the cluster's Prometheus (through the API server's service
        proxy, no port-forward); the result vector."""
        path = f"/api/v1/namespaces/{PROMETHEUS_NAMESPACE}/services/prometheus:9090/proxy/api/v1/query"
        answer = self.api.json(path, query=expression)
        if answer.get("status") != "success":
            raise KindError(f"Prometheus refused {expression!r}: {answer}")
        return list(answer["data"]["result"])

    def ensure_namespace(self, name: str) -> None:
        """A namespace for jobs, enforcing the `restricted` Pod Security Standard as platform teams'
        namespaces do: every pod in it (the operator's and the examples') must pass."""
        metadata = {"name": name, "labels": RESTRICTED_POD_SECURITY}
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def gpus_advertised(self, nodes: tuple[str, ...] = WORKERS, per_node: int = GPUS_PER_WORKER_NODE) -> bool:
        """Every one of `nodes` is Ready with the device plugin's full nvidia.com/gpu capacity."""
        found = {n["metadata"]["name"]: n for n in self.json("get", "nodes")["items"]}
        return all(
            name in found
            and _ready(found[name])
            and found[name]["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(per_node)
            for name in nodes
        )

    def take_node_away(self, node: str, timeout: float = 180) -> None:
        """What a spot preemption does: the node's pods are evicted (SIGTERM, their grace period),
        then the Node goes. A NoExecute taint evicts them; the Node is deleted once no pod that
        the taint evicts is left on it (DaemonSet pods tolerating everything stay until then)."""
        self.kubectl("taint", "node", node, f"{TAKEN_AWAY_TAINT}=true:NoExecute", "--overwrite")

        def evicted() -> bool:
            pods = self.json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
            return not any(_evicted_by_taint(p) for p in pods)

        poll(evicted, timeout, f"the pods on {node} to leave")
        self.kubectl("delete", "node", node, "--wait=true", timeout=timeout)

    def kill_containers(self, pods: list[dict[str, Any]]) -> None:
        """What a crash of every one of `pods` looks like: each container's first process SIGKILLed
        on its node (with it every process of the container), all pods at once; no signal the
        trainer could handle, no leave, no handoff."""
        template = "'{{.info.pid}}'"

        def kill(pod: dict[str, Any]) -> str:
            labels = f"--label io.kubernetes.pod.name={pod['metadata']['name']}"
            labels += f" --label io.kubernetes.pod.namespace={pod['metadata']['namespace']}"
            script = f"for c in $(crictl ps -q {labels}); do"
            script += f" kill -KILL $(crictl inspect -o go-template --template {template} $c); done"
            return run("docker", "exec", pod["spec"]["nodeName"], "sh", "-c", script, timeout=60)

        with ThreadPoolExecutor(max_workers=max(len(pods), 1)) as killers:
            list(killers.map(kill, pods))

    def bring_node_back(self, node: str, timeout: float = 300, gpus: int = GPUS_PER_WORKER_NODE) -> None:
        """A node joins again: the same container's kubelet registers a new Node, with fresh pod
        networking (a new node may get another pod CIDR, so the old bridge, addresses and CNI
        configuration go: the node is NotReady until flannel serves it again, as a new one is) and
        every pod's containers gone: a returned spot node is a new machine, so its agents (flannel,
        kube-router, the device plugin) start afresh instead of running on across the return with
        what they knew of the old node (stopping the kubelet alone left them running)."""
        reset = (
            "systemctl stop kubelet; crictl rmp --force --all >/dev/null;"
            " ip link delete cni0 2>/dev/null; ip link delete flannel.1 2>/dev/null;"
            " rm -rf /var/lib/cni/networks/* /run/flannel/subnet.env /etc/cni/net.d/10-flannel.conflist;"
            " systemctl start kubelet"
        )
        run("docker", "exec", node, "sh", "-c", reset, timeout=120)
        poll(lambda: self.gpus_advertised((node,), gpus), timeout, f"{node} Ready with its GPUs again")
        # Ready with GPUs is the kubelet and the device plugin; pods put there before its pod network
        # and NetworkPolicy agents serve again would start on a half-made node.
        poll(
            lambda: not daemons_not_ready(self.json("get", "pods", "-A")["items"], node),
            timeout,
            f"the DaemonSets' pods on {node} Ready again",
        )

    def give_back_taken_nodes(self, timeout: float = 300) -> list[str]:
        """Bring back every worker node that is gone or still carries the taken-away taint (a test
        that failed between taking a node and giving it back), so that the next test finds them
        all; the nodes given back."""
        nodes = {n["metadata"]["name"]: n for n in self.json("get", "nodes")["items"]}
        taken = [
            name
            for name in WORKERS
            if name not in nodes
            or any(t.get("key") == TAKEN_AWAY_TAINT for t in nodes[name]["spec"].get("taints", []))
        ]
        for name in taken:
            # A Node half taken away keeps its taint through the kubelet's return: it goes first.
            self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true", timeout=timeout)
            self.bring_node_back(name, timeout)
        return taken


def daemons_not_ready(pods: list[dict[str, Any]], node: str, workers: tuple[str, ...] = WORKERS) -> set[str]:
    """The DaemonSets (namespace/name) that run a pod on another worker node but no Ready pod on
    `node`: a worker given back is back once its agents (pod network, NetworkPolicy, device plugin)
    are."""
    elsewhere, ready_here = set(), set()
    for pod in pods:
        owner = _daemonset(pod)
        where = pod["spec"].get("nodeName")
        if owner is None:
            continue
        if where == node and _ready(pod):
            ready_here.add(owner)
        elif where != node and where in workers:
            elsewhere.add(owner)
    return elsewhere - ready_here


def _daemonset(pod: dict[str, Any]) -> str | None:
    for owner in pod["metadata"].get("ownerReferences", []):
        if owner.get("kind") == "DaemonSet":
            return f"{pod['metadata']['namespace']}/{owner['name']}"
    return None


def _ready(obj: dict[str, Any]) -> bool:
    """A node's or a pod's Ready condition."""
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _evicted_by_taint(pod: dict[str, Any]) -> bool:
    """Whether the taken-away taint evicts this pod (it tolerates no such NoExecute taint)."""
    tolerations = pod["spec"].get("tolerations", [])
    return not any(
        t.get("operator") == "Exists"
        and t.get("key") in (None, "", TAKEN_AWAY_TAINT)
        and t.get("effect") in (None, "", "NoExecute")
        for t in tolerations
    )


def load_image(image: str, nodes: tuple[str, ...] = ()) -> list[str]:
    """Into the nodes' containerd (default: every node), keeping only the unpacked copy
    (hack/kind/load-image.sh); returns the build-only caches it removed to make room."""
    output = run("bash", "hack/kind/load-image.sh", image, *([",".join(nodes)] if nodes else []))
    return [line for line in output.splitlines() if line.startswith("made room")]


def record_timing(line: str) -> None:
    """One setup step and its duration, into $EBBFLOW_TIMINGS when set (.ci/run prints that file)."""
    if path := os.environ.get("EBBFLOW_TIMINGS"):
        with open(path, "a") as timings:
            print(f"  e2e setup, {line.strip()}", file=timings)


def set_up(
    kind: Kind,
    say: Callable[[str], None] = lambda _: None,
    network_policy: bool = False,
    kueue: bool = False,
    store: bool = False,
) -> None:
    """Images, cluster, device plugin, the demo's and e2e's namespaces, the operator by `helm
    install` (CHART_VALUES) and Prometheus; each step is cached or idempotent: a second call on a
    running cluster takes seconds. `say` hears each step as it ends, with its duration.

    `network_policy`: kube-router's firewall beside flannel enforces NetworkPolicy (hack/kube-router;
    its binary takes a few minutes to build the first time on a machine). Installed right after the
    cluster, before anything runs in it; a cluster set up without it gets it on a later call.

    `kueue`: Kueue's manager beside the chart (`apply_kueue`; its binary takes about four minutes to
    build the first time), the chart with E2E_CHART_VALUES; without it, the chart with CHART_VALUES.
    Kueue may not serve yet when this returns (`kueue_ready` waits for it).

    `store`: SeaweedFS as the cluster's object store (`apply_object_store`), which may not serve yet
    when this returns (`make_bucket` waits for it).

    Every image is built before the cluster starts, so the trainer build's transient space and the
    kind nodes' copies of it are never needed at once; loading into a node frees build-only caches
    when the disk is short (hack/kind/load-image.sh, hack/free-build-caches.sh)."""
    started = time.monotonic()

    def done(step: str) -> None:
        nonlocal started
        say(f"  {step}: {time.monotonic() - started:.0f} s")
        started = time.monotonic()

    images = _build_images(network_policy, kueue, store)
    extras = "".join(f", {name}" for name, wanted in (("Kueue", kueue), ("SeaweedFS", store)) if wanted)
    done(f"images (operator, trainer, device plugin, Prometheus and its operator{extras})")
    run("bash", "hack/kind/up.sh")
    for namespace in (DEMO_NAMESPACE, E2E_NAMESPACE):
        kind.ensure_namespace(namespace)
    done("kind cluster (hack/kind/up.sh)")
    if network_policy:
        run("bash", "hack/kube-router/install.sh")
        done("kube-router, enforcing NetworkPolicy (hack/kube-router/install.sh)")
    # The trainer image (the longest step: 1.4 GB into three nodes) goes in beside the steps after
    # it, which do not need it: only the tests' and the demo's jobs do.
    with ThreadPoolExecutor(max_workers=1) as loader:
        trainer_loaded = loader.submit(_timed_load, TRAINER_IMAGE, WORKERS)
        load_image(images.plugin)
        manifest = (REPO / "hack" / "fake-gpu-plugin" / "deploy.yaml").read_text()
        manifest = manifest.replace("ebbflow/fake-gpu-plugin:latest", images.plugin)
        kind.kubectl("apply", "-f", "-", input=manifest)
        done("fake GPU device plugin")
        # The chart's monitors need only the Prometheus Operator's CRDs: Prometheus starts beside it.
        apply_monitoring(kind, images.monitoring)
        done("Prometheus Operator's CRDs and workloads applied (hack/prometheus-operator)")
        if images.kueue is not None:
            # The operator watches Kueue's Workloads and ResourceFlavors: their CRDs come first.
            apply_kueue(kind, *images.kueue)
            done("Kueue's CRDs and manager applied (hack/kueue)")
        if images.store is not None:
            apply_object_store(kind, images.store)
            done("SeaweedFS, the object store, applied (hack/seaweedfs)")
        install_chart(kind, E2E_CHART_VALUES if kueue else CHART_VALUES)
        done("operator (helm upgrade --install charts/ebbflow, with its ServiceMonitor and PodMonitor)")
        monitoring_rolled_out(kind)
        done("Prometheus Operator and its Prometheus rolled out, beside the chart")
        removals, seconds = trainer_loaded.result()
    for removal in removals:
        say(f"  {removal}")
    say(f"  {TRAINER_IMAGE} in the worker nodes, beside the steps above: {seconds:.0f} s")
    done(f"waiting for {TRAINER_IMAGE} in the worker nodes")
    poll(kind.gpus_advertised, 180, "the device plugin's nvidia.com/gpu on every worker")
    poll(lambda: kind.query('up{job="ebbflow-metrics"} == 1'), 180, "Prometheus scraping the operator")
    done("operator scraped; nvidia.com/gpu advertised")


@dataclass(frozen=True)
class Images:
    """What `set_up` loads into the cluster, built (or found cached) before the cluster starts."""

    plugin: str
    monitoring: Monitoring
    kueue: tuple[str, Path] | None  # the manager's image and the module's config/ tree
    store: str | None  # SeaweedFS's image


def _build_images(network_policy: bool, kueue: bool, store: bool) -> Images:
    """The operator's and trainer's images, and those of the cluster's add-ons `set_up` was asked for."""
    run("bash", "hack/images/build-images.sh")
    if network_policy:
        run("bash", "hack/kube-router/build-image.sh")
    plugin = run("bash", "hack/fake-gpu-plugin/build-image.sh").strip().splitlines()[-1]
    run("bash", "hack/build-tools.sh", "prometheus")
    prometheus = run("bash", "hack/prometheus/build-image.sh").strip().splitlines()[-1]
    monitoring = Monitoring(prometheus, *run("bash", "hack/prometheus-operator/build-image.sh").split()[-3:])
    kueue_image = None
    if kueue:
        image, config = run("bash", "hack/kueue/build-image.sh").split()[-2:]
        kueue_image = (image, Path(config))
    store_image = run("bash", "hack/seaweedfs/build-image.sh").split()[-1] if store else None
    return Images(plugin, monitoring, kueue_image, store_image)


def _timed_load(image: str, nodes: tuple[str, ...]) -> tuple[list[str], float]:
    """`load_image`, and how long it took."""
    started = time.monotonic()
    removals = load_image(image, nodes)
    return removals, time.monotonic() - started


@dataclass(frozen=True)
class Monitoring:
    """The images of Prometheus and of its operator (built from the Go module proxy by hack/prometheus
    and hack/prometheus-operator), and the directory of the operator's CRDs."""

    prometheus: str
    operator: str
    config_reloader: str
    crds: str


def apply_monitoring(kind: Kind, monitoring: Monitoring) -> None:
    """The Prometheus Operator and the Prometheus it runs (hack/prometheus-operator/deploy.yaml), which
    scrapes whatever the chart's ServiceMonitor and PodMonitor select; queried through the API server.
    Returns once the CRDs are established and the workloads applied (`monitoring_rolled_out` waits for
    them). The CRDs are applied server-side (too large for kubectl's last-applied annotation)."""
    for image in (monitoring.prometheus, monitoring.operator, monitoring.config_reloader):
        load_image(image, WORKERS)
    kind.kubectl("apply", "--server-side", "--force-conflicts", "-f", monitoring.crds, timeout=300)
    kind.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s", timeout=150)
    manifest = (REPO / "hack" / "prometheus-operator" / "deploy.yaml").read_text()
    for placeholder, image in (
        ("ebbflow/prometheus:dev", monitoring.prometheus),
        ("ebbflow/prometheus-operator:dev", monitoring.operator),
        ("ebbflow/prometheus-config-reloader:dev", monitoring.config_reloader),
    ):
        manifest = manifest.replace(placeholder, image)
    kind.kubectl("apply", "-f", "-", input=manifest)


def apply_kueue(kind: Kind, image: str, config: Path) -> None:
    """Kueue's release install (`kubectl kustomize` of the pinned module's config/default) as
    `kueue_cluster.in_cluster` changes it, its image on the control-plane node; returns once its
    CRDs are established (`rollout` waits for the manager). Server-side: the CRDs are large."""
    load_image(image, (CONTROL_PLANE,))
    rendered = [m for m in yaml.safe_load_all(kind.kubectl("kustomize", str(config / "default"))) if m]
    manifests = kueue_cluster.in_cluster(rendered, image)
    kind.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(manifests)
    )
    kind.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s", timeout=150)


def apply_object_store(kind: Kind, image: str) -> None:
    """SeaweedFS on the control-plane node (`object_store.manifests`); `make_bucket` waits for it."""
    load_image(image, (CONTROL_PLANE,))
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(object_store.manifests(image)))


def make_bucket(kind: Kind, bucket: str, timeout: float = 180) -> None:
    """`bucket` in the cluster's object store, once the store has rolled out and serves (weed shell
    waits up to 30 s for the store's master, and fails after)."""
    rollout(kind, object_store.NAMESPACE, object_store.SERVICE)
    command, script = object_store.bucket_command(bucket)
    exec_in = ("-n", object_store.NAMESPACE, "exec", "-i", f"deployment/{object_store.SERVICE}", "--")

    def made() -> bool | NotYet:
        try:
            output = kind.kubectl(*exec_in, *command, input=script, timeout=60)
        except KindError as error:
            output = str(error)
        return object_store.created(bucket, output) or NotYet(output[-300:])

    poll(made, timeout, f"bucket {bucket} in the cluster's object store")


def kueue_ready(kind: Kind) -> None:
    """Kueue's manager rolled out: its webhook certificate, which its internal certificate management
    writes into a Secret once it runs, reached the pod through the kubelet's periodic Secret sync (a
    minute or two after `apply_kueue`, so `set_up` does not wait for it)."""
    rollout(kind, kueue_cluster.NAMESPACE, kueue_cluster.DEPLOYMENT)


def monitoring_rolled_out(kind: Kind) -> None:
    """The Prometheus Operator's Deployment and the StatefulSet of the Prometheus it made, rolled out."""
    rollout(kind, PROMETHEUS_NAMESPACE, "prometheus-operator")
    poll(
        lambda: kind.kubectl("-n", PROMETHEUS_NAMESPACE, "get", "statefulsets", "-o", "name").strip(),
        120,
        "the operator's Prometheus StatefulSet",
    )
    rollout(kind, PROMETHEUS_NAMESPACE, "prometheus-ebbflow", kind_of="statefulset")


def rollout(kind: Kind, namespace: str, name: str, timeout_s: int = 300, kind_of: str = "deployment") -> None:
    """Waits for the rollout of a Deployment (or another `kind_of` workload); when it does not end in
    time, the error carries what its pods and their events say (one CI run timed out on Prometheus
    and printed nothing else)."""
    workload = f"{kind_of}/{name}"
    try:
        kind.kubectl(
            "-n", namespace, "rollout", "status", workload, f"--timeout={timeout_s}s", timeout=timeout_s + 20
        )
    except KindError as error:
        found = []
        for what in (
            ("get", "pods", "-o", "wide"),
            ("describe", "pods"),
            ("logs", workload, "--all-containers", "--tail=40"),
            ("logs", workload, "--all-containers", "--tail=40", "--previous"),
        ):
            try:
                found.append(
                    f"$ kubectl -n {namespace} {' '.join(what)}\n{kind.kubectl('-n', namespace, *what)}"
                )
            except KindError as failed:
                found.append(f"$ kubectl -n {namespace} {' '.join(what)}: {failed}")
        raise KindError(f"{error}\n" + "\n".join(found)) from None


def versioned_tag(image: str) -> str:
    """The content-hashed tag that `image` (a :dev tag) also carries, e.g. ebbflow/operator:3f2a...:
    a Deployment given it rolls out when the image changes, which a reused :dev tag would not."""
    repository = image.rpartition(":")[0]
    tags = run("docker", "image", "inspect", image, "--format", '{{join .RepoTags " "}}').split()
    versioned = sorted(t for t in tags if t.startswith(f"{repository}:") and t != image)
    return versioned[0] if versioned else image


def install_chart(kind: Kind, values: tuple[str, ...] = ()) -> None:
    """`helm upgrade --install` of charts/ebbflow with the operator image loaded into the workers;
    returns once the operator's Deployment is Ready. `values` are extra `--set` assignments."""
    _adopt_crd(kind)
    image = versioned_tag(OPERATOR_IMAGE)
    load_image(image, WORKERS)
    repository, _, tag = image.rpartition(":")
    command = ["helm", "upgrade", "--install", RELEASE, str(REPO / "charts" / "ebbflow")]
    command += ["--namespace", RELEASE_NAMESPACE, "--create-namespace", "--wait", "--timeout", "300s"]
    command += ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
    for value in values:
        command += ["--set", value]
    run(*command, timeout=420)


def _adopt_crd(kind: Kind) -> None:
    """A CRD applied by kubectl (crds/, by hand or by an older setup) becomes the release's, as Helm
    documents for adopting existing objects; otherwise `helm install` refuses to touch it."""
    crds = kind.json("get", "customresourcedefinitions", "-l", "!app.kubernetes.io/managed-by")["items"]
    for crd in crds:
        if crd["spec"]["group"] != API_GROUP:
            continue
        name = crd["metadata"]["name"]
        kind.kubectl("label", "crd", name, "app.kubernetes.io/managed-by=Helm", "--overwrite")
        kind.kubectl(
            "annotate",
            "crd",
            name,
            f"meta.helm.sh/release-name={RELEASE}",
            f"meta.helm.sh/release-namespace={RELEASE_NAMESPACE}",
            "--overwrite",
        )


def set_up_e2e(kind: Kind, say: Callable[[str], None]) -> None:
    """The e2e tier's cluster: NetworkPolicy enforced, Kueue beside the chart, an object store."""
    set_up(kind, say=say, network_policy=True, kueue=True, store=True)


def main() -> None:
    """Sets the e2e tier's cluster up (`set_up_e2e`), saying each step as it ends."""

    def say(line: str) -> None:
        print(line, flush=True)
        record_timing(line)

    set_up_e2e(Kind(), say)


if __name__ == "__main__":
    main()
