"""Deterministic names and the bodies of the objects the operator creates for a job (plain dicts).

Every child is owned by its job (controller owner reference), so deleting the job garbage-collects
it, and carries the contract's labels so the operator finds it again after a restart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ebbflow_api import contract

from .model import Job, Json, Placement

WORKER_NAME = re.compile(r"^(?P<job>.+)-worker-(?P<index>\d+)$")
# Kubernetes' terminationMessagePath when a container sets none: the trainer writes why it stopped
# there, and the kubelet copies it into the container's state.terminated.message.
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
RENDEZVOUS_USER = 65532  # the trainer image's unprivileged user
# The job's pods share one process namespace (unless a worker template says otherwise), so the pause
# container is PID 1 and the trainer's process is not: a SIGTERM that comes before the process takes
# it ends the process at once, where PID 1 would discard it and train on until its grace period ends.
SHARE_PROCESS_NAMESPACE = True
# spec.maxGlobalBatchSize: the downward-API volume projecting the worker's global-batch-size
# annotation, and where the trainer finds it (contract.ENV_GLOBAL_BATCH_SIZE_FILE).
BATCH_VOLUME = "ebbflow-global-batch"
BATCH_MOUNT = "/etc/ebbflow/global-batch"
BATCH_FILE = "global-batch-size"
# spec.bandLimit: the same for the worker's memory-budget annotation (contract.ENV_MEMORY_BUDGET_FILE).
BUDGET_VOLUME = "ebbflow-memory-budget"
BUDGET_MOUNT = "/etc/ebbflow/memory-budget"
BUDGET_FILE = "memory-budget-mib"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def worker_index(name: str) -> int | None:
    match = WORKER_NAME.match(name)
    return int(match["index"]) if match else None


def rendezvous_name(job: str) -> str:
    """The rendezvous pod's name and hostname."""
    return f"{job}-rdzv"


def service_name(job: str) -> str:
    """The job's one Service: headless, every pod of the job (the NetworkPolicy's name, another kind)."""
    return f"{job}-pods"


def network_policy_name(job: str) -> str:
    return f"{job}-pods"


def rendezvous_token_name(job: str) -> str:
    """The Secret holding the job's rendezvous token (contract.RDZV_TOKEN_KEY)."""
    return f"{job}-rdzv-token"


def declarations_port(job: Job) -> int:
    """Where the rendezvous pod takes the operator's declarations of deaths: the contract's port, or
    the next one when spec.rendezvous.port takes it."""
    port = contract.DECLARATIONS_PORT
    return port + 1 if job.spec.rendezvous.port == port else port


def rendezvous_host(job: str, namespace: str) -> str:
    """The rendezvous pod's DNS name: whichever pod hosts the store now (a replacement takes the name)."""
    return f"{rendezvous_name(job)}.{service_name(job)}.{namespace}.svc"


def rendezvous_endpoint(job: Job) -> str:
    """host:port of the store for the job's workers."""
    return f"{rendezvous_host(job.name, job.namespace)}:{job.spec.rendezvous.port}"


def worker_selector(job: str) -> str:
    """Label selector of a job's workers (status.selector, used by `kubectl scale`)."""
    return f"{contract.LABEL_JOB_NAME}={job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"


def owner_reference(job: Job) -> Json:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(job: Job, role: str) -> dict[str, str]:
    return {contract.LABEL_JOB_NAME: job.name, contract.LABEL_ROLE: role}


def _env(job: Job, world_generation: int, container: Json) -> list[Json]:
    """The contract's variables for one container of a worker (the termination message path is
    the container's own)."""
    spec = job.spec
    message_path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
    values = {
        contract.ENV_JOB_NAME: job.name,
        contract.ENV_NAMESPACE: job.namespace,
        contract.ENV_RDZV_ENDPOINT: rendezvous_endpoint(job),
        contract.ENV_RDZV_ID: job.uid,
        contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS: spec.rendezvous.join_timeout_seconds,
        contract.ENV_MIN_REPLICAS: spec.replicas.min,
        contract.ENV_MAX_REPLICAS: spec.replicas.max,
        contract.ENV_VIRTUAL_NODES: spec.resolved_virtual_nodes,
        contract.ENV_GLOBAL_BATCH_SIZE: spec.global_batch_size,
        contract.ENV_BATCHING: spec.batching,
        contract.ENV_LR_SCALING: spec.lr_scaling,
        contract.ENV_WORLD_GENERATION: world_generation,
        contract.ENV_CHECKPOINT_PATH: spec.checkpoint.path,
        contract.ENV_CHECKPOINT_INTERVAL_STEPS: spec.checkpoint.interval_steps,
        contract.ENV_METRICS_PORT: contract.METRICS_PORT,
        contract.ENV_LEAVE_GRACE_SECONDS: spec.leave_grace_seconds,
        contract.ENV_MAX_NONFINITE_STEPS: spec.max_non_finite_steps,
        contract.ENV_TERMINATION_MESSAGE_PATH: message_path,
    }
    if spec.momentum_correction:
        values[contract.ENV_MOMENTUM_CORRECTION] = "true"
    if spec.max_global_batch_size is not None:
        values[contract.ENV_MAX_GLOBAL_BATCH_SIZE] = spec.max_global_batch_size
        values[contract.ENV_GLOBAL_BATCH_SIZE_FILE] = f"{BATCH_MOUNT}/{BATCH_FILE}"
    if spec.band_limit is not None:
        values[contract.ENV_BAND_LIMIT] = "true"
        values[contract.ENV_MAX_COMPRESSION_RATE] = spec.band_limit.max_compression_rate
        values[contract.ENV_MEMORY_BUDGET_FILE] = f"{BUDGET_MOUNT}/{BUDGET_FILE}"
    checkpoint = spec.checkpoint
    if checkpoint.endpoint is not None:
        values[contract.ENV_CHECKPOINT_ENDPOINT] = checkpoint.endpoint
    if checkpoint.retain is not None:
        values[contract.ENV_CHECKPOINT_RETAIN] = checkpoint.retain
    env: list[Json] = [{"name": name, "value": str(value)} for name, value in values.items()]
    env.append({"name": contract.ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    if checkpoint.credentials_secret is not None:
        env += _secret_env(checkpoint.credentials_secret)
    return env


def _secret_env(secret: str) -> list[Json]:
    """The object store's credentials from the Secret spec.checkpoint.credentialsSecret names, as the
    standard AWS variables (the keys and secret key required, the rest optional)."""
    keys = [("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False)]
    keys += [("AWS_REGION", True), ("AWS_SESSION_TOKEN", True)]
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}}
        for key, optional in keys
    ]


def trainer_service_account(accounts: Mapping[str, str], namespace: str) -> str:
    """The ServiceAccount for workers in `namespace` (`--trainer-service-account`): the namespace's
    own entry, else the entry for every namespace (key ""), else "" (the namespace's default)."""
    return accounts.get(namespace) or accounts.get("", "")


def global_batch_in_use(job: Job) -> int:
    """B as the workers should have it: the policy's last choice (status), else the spec's."""
    return job.status.global_batch_size or job.spec.global_batch_size


def _project_annotation(spec: Json, annotation: str, volume_name: str, mount_path: str, file: str) -> None:
    """Mounts one of the worker's annotations as a file in every container, read-only, in a volume of
    its own (the kubelet rewrites the file when the operator changes the annotation; env vars could
    not change; an absent annotation is an empty file)."""
    field = f"metadata.annotations['{annotation}']"
    item = {"path": file, "fieldRef": {"fieldPath": field}}
    volume = {"name": volume_name, "downwardAPI": {"items": [item]}}
    spec["volumes"] = [*(v for v in spec.get("volumes") or [] if v.get("name") != volume_name), volume]
    mount = {"name": volume_name, "mountPath": mount_path, "readOnly": True}
    for container in spec["containers"]:
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != volume_name]
        container["volumeMounts"] = [*mounts, mount]


def pin_to_node(spec: Json, node: str) -> None:
    """Requires the pod to run on `node`, by name (`matchFields` on metadata.name, as the DaemonSet
    controller pins its pods), and still to meet every node-affinity term of the template: the
    field is added to each of its required terms (terms are ORed, a term's parts ANDed)."""
    by_name = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = spec.setdefault("affinity", {})
    required = affinity.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), by_name]} for term in terms
    ]


def worker_pod(
    job: Job,
    index: int,
    world_generation: int,
    service_accounts: Mapping[str, str] | None = None,
    global_batch: int | None = None,
    node: str | None = None,
    memory_budget: int | None = None,
    placement: Placement | None = None,
) -> Json:
    """A worker: the job's template plus the contract's labels, annotations and environment; with
    `node`, required to run there (`pin_to_node`: where the policy placed it, or moved the job); with
    `placement`, on the nodes its Kueue flavors name, tolerating their taints.

    `service_accounts` (namespace -> name, "" for every namespace) names the ServiceAccount of
    workers whose template sets none: the trainer patches its own pod's progress annotation with
    that account's token, so it needs a Role allowing it (the Helm chart creates one). With
    spec.maxGlobalBatchSize the pod carries `global_batch` (default: `global_batch_in_use`) in its
    annotation, projected into the file the trainer reads. With spec.bandLimit it carries
    `memory_budget` (MiB; none while the job's budget is unknown) the same way.
    """
    template = job.spec.template.to_json()
    metadata: Json = template.get("metadata") or {}
    spec: Json = template["spec"]
    for container in spec["containers"]:
        env = _env(job, world_generation, container)
        contract_names = {e["name"] for e in env}
        kept = [e for e in container.get("env") or [] if e.get("name") not in contract_names]
        container["env"] = kept + env
    if node is not None:
        pin_to_node(spec, node)
    if placement is not None and placement.node_labels:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **placement.node_labels}
    if placement is not None and placement.tolerations:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *placement.tolerations]
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = job.spec.leave_grace_seconds
    spec.setdefault("shareProcessNamespace", SHARE_PROCESS_NAMESPACE)
    spec["hostname"] = worker_name(job.name, index)
    spec["subdomain"] = service_name(job.name)
    account = trainer_service_account(service_accounts or {}, job.namespace)
    if account and not spec.get("serviceAccountName") and not spec.get("serviceAccount"):
        spec["serviceAccountName"] = account
    labels = dict(metadata.get("labels") or {})
    annotations = {
        **(metadata.get("annotations") or {}),
        contract.ANNOTATION_WORLD_GENERATION: str(world_generation),
    }
    if job.spec.max_global_batch_size is not None:
        _project_annotation(
            spec, contract.ANNOTATION_GLOBAL_BATCH_SIZE, BATCH_VOLUME, BATCH_MOUNT, BATCH_FILE
        )
        chosen = global_batch if global_batch is not None else global_batch_in_use(job)
        annotations[contract.ANNOTATION_GLOBAL_BATCH_SIZE] = str(chosen)
    if job.spec.band_limit is not None:
        _project_annotation(spec, contract.ANNOTATION_MEMORY_BUDGET, BUDGET_VOLUME, BUDGET_MOUNT, BUDGET_FILE)
        if memory_budget is not None:
            annotations[contract.ANNOTATION_MEMORY_BUDGET] = str(memory_budget)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": worker_name(job.name, index),
            "namespace": job.namespace,
            "labels": {
                **labels,
                **_labels(job, contract.ROLE_WORKER),
                contract.LABEL_WORKER_INDEX: str(index),
            },
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def rendezvous_pod(job: Job) -> Json:
    """The CPU-only pod that hosts the c10d store; it stays while workers come and go."""
    rendezvous = job.spec.rendezvous
    pod_spec = job.spec.template.spec.to_json()
    image = rendezvous.image or pod_spec["containers"][0]["image"]
    default = [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, str(rendezvous.port)]
    command = rendezvous.command or default
    spec: Json = {
        "restartPolicy": "Always",
        "shareProcessNamespace": SHARE_PROCESS_NAMESPACE,
        # Its DNS name under the job's headless Service is the workers' rendezvous endpoint.
        "hostname": rendezvous_name(job.name),
        "subdomain": service_name(job.name),
        "containers": [
            {
                "name": "rendezvous",
                "image": image,
                "command": command,
                "env": [
                    {"name": contract.ENV_JOB_NAME, "value": job.name},
                    {"name": contract.ENV_NAMESPACE, "value": job.namespace},
                    {"name": contract.ENV_RDZV_ID, "value": job.uid},
                    {"name": contract.ENV_RDZV_PORT, "value": str(rendezvous.port)},
                    {"name": contract.ENV_MIN_REPLICAS, "value": str(job.spec.replicas.min)},
                    {"name": contract.ENV_MAX_REPLICAS, "value": str(job.spec.replicas.max)},
                    {"name": contract.ENV_DECLARATIONS_PORT, "value": str(declarations_port(job))},
                    # Optional: without its Secret the store serves, and deaths wait for heartbeats.
                    {
                        "name": contract.ENV_RDZV_TOKEN,
                        "valueFrom": {
                            "secretKeyRef": {
                                "name": rendezvous_token_name(job.name),
                                "key": contract.RDZV_TOKEN_KEY,
                                "optional": True,
                            }
                        },
                    },
                ],
                "ports": [
                    {"name": "c10d", "containerPort": rendezvous.port},
                    {"name": "declarations", "containerPort": declarations_port(job)},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        # The `restricted` Pod Security Standard, so the pod is admitted wherever it is enforced. The
        # user is set (the trainer image's 65532) so that an image whose USER is a name passes too.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RENDEZVOUS_USER,
            "runAsGroup": RENDEZVOUS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    for key in ("imagePullSecrets", "serviceAccountName", "priorityClassName"):
        if key in pod_spec:
            spec[key] = pod_spec[key]
    # It may run where the workers may (same nodeSelector, affinity, tolerations) but needs no GPU.
    for key in ("nodeSelector", "affinity", "tolerations"):
        if key in pod_spec:
            spec[key] = pod_spec[key]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": rendezvous_name(job.name),
            "namespace": job.namespace,
            "labels": _labels(job, contract.ROLE_RENDEZVOUS),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def rendezvous_token_secret(job: Job) -> Json:
    """The Secret the rendezvous pod reads the job's token from, without the token: the reconciler
    signs it in when it creates the Secret (a token never travels in a plan)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": rendezvous_token_name(job.name),
            "namespace": job.namespace,
            "labels": _labels(job, contract.ROLE_RENDEZVOUS),
            "ownerReferences": [owner_reference(job)],
        },
    }


def job_service(job: Job) -> Json:
    """One headless Service for every pod of the job: stable DNS names for the workers
    (`<job>-<index>.<job>-pods`) and the rendezvous pod (`<job>-rdzv.<job>-pods`, the workers' endpoint).
    Not-ready pods are listed too, so a starting store is found as soon as it has an address. One
    Service instead of a ClusterIP one for the store and a headless one for the workers saves a write
    per job; a replaced store gets a new address under the same name (DNS answers live 5 s in kind's
    CoreDNS), and the trainers resolve the name again on every reconnect."""
    port = job.spec.rendezvous.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.name),
            "namespace": job.namespace,
            "labels": {contract.LABEL_JOB_NAME: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "selector": {contract.LABEL_JOB_NAME: job.name},
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "ports": [{"name": "c10d", "port": port, "targetPort": port}],
        },
    }


def network_policy(job: Job) -> Json:
    """Ingress to the job's pods (workers and the rendezvous pod) only from the job's own pods: the
    c10d store and the workers' collective ports are the job's alone. The trainers' metrics port
    stays open to every namespace, for Prometheus, and the rendezvous pod's declarations port for the
    operator, wherever it runs (each declaration carries the job's token). NetworkPolicies select by
    label, so anyone who may create pods in the namespace can wear the job's labels: the namespace is
    the trust boundary.
    Enforced only where the cluster's network plugin implements NetworkPolicy."""
    job_pods = {"matchLabels": {contract.LABEL_JOB_NAME: job.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(job.name),
            "namespace": job.namespace,
            "labels": {contract.LABEL_JOB_NAME: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": job_pods}]},
                {"ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]},
                {"ports": [{"protocol": "TCP", "port": declarations_port(job)}]},
            ],
        },
    }
