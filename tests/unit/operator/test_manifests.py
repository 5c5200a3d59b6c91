"""The objects the operator creates for a job: worker pods, the rendezvous pod and the Services."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from ebbflow_api import contract
from ebbflow_api.models import GPU_RESOURCE, MAX_JOB_NAME_LENGTH, MAX_REPLICAS
from ebbflow_devtools.builders import DEFAULT_IMAGE, NOW, JobBuilder, make_job
from ebbflow_operator.decision import manifests
from ebbflow_operator.decision.model import Job, format_time, parse_job, parse_pod

Json = dict[str, Any]

CONTRACT_ENV = (
    contract.ENV_JOB_NAME,
    contract.ENV_NAMESPACE,
    contract.ENV_POD_NAME,
    contract.ENV_RDZV_ENDPOINT,
    contract.ENV_RDZV_ID,
    contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS,
    contract.ENV_MIN_REPLICAS,
    contract.ENV_MAX_REPLICAS,
    contract.ENV_VIRTUAL_NODES,
    contract.ENV_GLOBAL_BATCH_SIZE,
    contract.ENV_BATCHING,
    contract.ENV_LR_SCALING,
    contract.ENV_WORLD_GENERATION,
    contract.ENV_CHECKPOINT_PATH,
    contract.ENV_CHECKPOINT_INTERVAL_STEPS,
    contract.ENV_METRICS_PORT,
    contract.ENV_LEAVE_GRACE_SECONDS,
    contract.ENV_MAX_NONFINITE_STEPS,
    contract.ENV_TERMINATION_MESSAGE_PATH,
)
KUBERNETES_TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # a container's default


def env_of(container: Json) -> dict[str, str]:
    """name -> value of the plain (not valueFrom) variables; duplicates are checked separately."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def env_names(container: Json) -> list[str]:
    return [e["name"] for e in container.get("env", [])]


def full_job(**spec: Any) -> Job:
    """A job whose template uses most of what a pod template can carry (plus any other `spec` fields)."""
    builder = (
        JobBuilder("train", "ml")
        .replicas(2, 4)
        .gpus(2)
        .cpu("4")
        .command("python", "-m", "ebbflow_trainer", "run", "train.py")
        .env(HF_HOME="/cache", **{contract.ENV_VIRTUAL_NODES: "999", contract.ENV_RDZV_ID: "stale"})
        .node_selector({"gpu": "a100"})
        .toleration("ebbflow.dev/spot", "NoSchedule")
        .pod_spec(
            volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            serviceAccountName="trainer",
            priorityClassName="high",
            imagePullSecrets=[{"name": "registry"}],
            securityContext={"runAsNonRoot": True},
            restartPolicy="OnFailure",
            terminationGracePeriodSeconds=1,
        )
        .set(leaveGraceSeconds=17, **spec)
    )
    raw = builder.obj()
    raw["spec"]["template"]["metadata"] = {
        "labels": {"team": "vision", contract.LABEL_ROLE: "spoofed"},
        "annotations": {"sidecar.istio.io/inject": "false"},
    }
    raw["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "ckpt", "mountPath": "/ckpt"}
    ]
    raw["spec"]["template"]["spec"]["containers"].append(
        {"name": "sidecar", "image": "busybox", "env": [{"name": "SIDE", "value": "1"}]}
    )
    raw["metadata"].update(uid="uid-train", generation=1, creationTimestamp=format_time(NOW))
    return parse_job(raw)


# --- worker_pod ----------------------------------------------------------------------------------


def test_worker_pod_metadata() -> None:
    job = full_job()
    pod = manifests.worker_pod(job, 3, world_generation=9)
    metadata = pod["metadata"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert (metadata["name"], metadata["namespace"]) == ("train-worker-3", "ml")
    assert metadata["labels"] == {
        "team": "vision",  # the template's own label is kept
        contract.LABEL_JOB_NAME: "train",
        contract.LABEL_ROLE: contract.ROLE_WORKER,  # a template cannot spoof the role
        contract.LABEL_WORKER_INDEX: "3",
    }
    assert metadata["annotations"] == {
        "sidecar.istio.io/inject": "false",
        contract.ANNOTATION_WORLD_GENERATION: "9",
    }
    assert metadata["ownerReferences"] == [
        {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "name": "train",
            "uid": "uid-train",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def adaptive(status: Json | None = None) -> Job:
    builder = JobBuilder("a").replicas(1, 4).virtual_nodes(8).global_batch_size(256)
    return make_job(builder.set(maxGlobalBatchSize=2048, lrScaling="adascale"), status=status)


@pytest.mark.parametrize(
    ("job", "chosen", "annotation"),
    [
        pytest.param(adaptive(), None, "256", id="spec-batch-at-first"),
        pytest.param(adaptive({"globalBatchSize": 1024}), None, "1024", id="the-batch-in-use"),
        pytest.param(adaptive({"globalBatchSize": 1024}), 512, "512", id="this-pass-choice"),
    ],
)
def test_adaptive_batch_worker_reads_its_annotation_from_a_file(
    job: Job, chosen: int | None, annotation: str
) -> None:
    pod = manifests.worker_pod(job, 0, world_generation=1, global_batch=chosen)
    assert pod["metadata"]["annotations"][contract.ANNOTATION_GLOBAL_BATCH_SIZE] == annotation
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == manifests.BATCH_VOLUME]
    [item] = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{contract.ANNOTATION_GLOBAL_BATCH_SIZE}']"
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[contract.ENV_MAX_GLOBAL_BATCH_SIZE] == "2048"
        mount = next(m for m in container["volumeMounts"] if m["name"] == manifests.BATCH_VOLUME)
        assert env[contract.ENV_GLOBAL_BATCH_SIZE_FILE] == f"{mount['mountPath']}/{item['path']}"


def test_fixed_batch_worker_has_no_batch_file() -> None:
    pod = manifests.worker_pod(full_job(), 0, world_generation=1, global_batch=512)
    assert contract.ANNOTATION_GLOBAL_BATCH_SIZE not in pod["metadata"]["annotations"]
    assert all(v["name"] != manifests.BATCH_VOLUME for v in pod["spec"].get("volumes") or [])
    names = {e["name"] for c in pod["spec"]["containers"] for e in c["env"]}
    assert not names & {contract.ENV_MAX_GLOBAL_BATCH_SIZE, contract.ENV_GLOBAL_BATCH_SIZE_FILE}


def band_limited(**band: Any) -> Job:
    return make_job(JobBuilder("b").replicas(1, 4).band_limit(**band))


BAND_LIMIT_ENV = {contract.ENV_BAND_LIMIT, contract.ENV_MAX_COMPRESSION_RATE, contract.ENV_MEMORY_BUDGET_FILE}


@pytest.mark.parametrize(
    ("job", "budget", "annotation", "rate"),
    [
        pytest.param(band_limited(), 20480, "20480", "0.75", id="budget-known-default-rate"),
        pytest.param(
            band_limited(max_compression_rate=0.5), None, None, "0.5", id="budget-unknown-no-annotation"
        ),
        pytest.param(
            band_limited(memory_budget_mib=8000, max_compression_rate=0), 8000, "8000", "0.0", id="rate-zero"
        ),
    ],
)
def test_band_limited_worker_reads_its_budget_from_a_file(
    job: Job, budget: int | None, annotation: str | None, rate: str
) -> None:
    pod = manifests.worker_pod(job, 0, world_generation=1, memory_budget=budget)
    assert pod["metadata"]["annotations"].get(contract.ANNOTATION_MEMORY_BUDGET) == annotation
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == manifests.BUDGET_VOLUME]
    [item] = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{contract.ANNOTATION_MEMORY_BUDGET}']"
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env[contract.ENV_BAND_LIMIT], env[contract.ENV_MAX_COMPRESSION_RATE]) == ("true", rate)
        mount = next(m for m in container["volumeMounts"] if m["name"] == manifests.BUDGET_VOLUME)
        assert mount["readOnly"] is True
        assert env[contract.ENV_MEMORY_BUDGET_FILE] == f"{mount['mountPath']}/{item['path']}"
        assert env[contract.ENV_MEMORY_BUDGET_FILE] == "/etc/ebbflow/memory-budget/memory-budget-mib"


def without_band_limit(pod: Json) -> Json:
    """`pod` less what spec.bandLimit adds: its variables, volume, mounts and annotation."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["annotations"].pop(contract.ANNOTATION_MEMORY_BUDGET, None)
    spec = pod["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != manifests.BUDGET_VOLUME]
    for container in spec["containers"]:
        container["env"] = [e for e in container["env"] if e["name"] not in BAND_LIMIT_ENV]
        mounts = [m for m in container["volumeMounts"] if m["name"] != manifests.BUDGET_VOLUME]
        if mounts:
            container["volumeMounts"] = mounts
        else:
            del container["volumeMounts"]
    return pod


def test_band_limit_adds_its_file_and_nothing_else_and_jobs_without_it_are_untouched() -> None:
    plain = manifests.worker_pod(full_job(), 1, world_generation=4)
    limited = manifests.worker_pod(full_job(bandLimit={}), 1, world_generation=4, memory_budget=20480)
    assert without_band_limit(limited) == plain != limited
    # A budget offered for a job that did not opt in changes nothing.
    assert manifests.worker_pod(full_job(), 1, world_generation=4, memory_budget=20480) == plain
    names = {e["name"] for c in plain["spec"]["containers"] for e in c["env"]}
    assert not names & BAND_LIMIT_ENV
    assert contract.ANNOTATION_MEMORY_BUDGET not in plain["metadata"]["annotations"]
    assert all(v["name"] != manifests.BUDGET_VOLUME for v in plain["spec"]["volumes"])


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, None, id="unset-absent"),
        pytest.param({"lrScaling": "linear", "momentumCorrection": False}, None, id="off-absent"),
        pytest.param({"lrScaling": "linear", "momentumCorrection": True}, "true", id="on"),
    ],
)
def test_momentum_correction_reaches_every_container_only_when_on(fields: Json, expected: str | None) -> None:
    job = make_job(JobBuilder("m").replicas(1, 2).global_batch_size(64).set(**fields))
    for container in manifests.worker_pod(job, 0, world_generation=1)["spec"]["containers"]:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.get(contract.ENV_MOMENTUM_CORRECTION) == expected


def test_worker_pod_spec_overrides() -> None:
    job = full_job()
    spec = manifests.worker_pod(job, 3, world_generation=9)["spec"]
    assert spec["restartPolicy"] == "Never"  # the template said OnFailure
    assert spec["terminationGracePeriodSeconds"] == 17 == job.spec.leave_grace_seconds
    assert spec["hostname"] == manifests.worker_name("train", 3) == "train-worker-3"
    assert spec["subdomain"] == manifests.service_name("train") == "train-pods"


@pytest.mark.parametrize(
    ("builder", "grace"),
    [
        pytest.param(JobBuilder("j"), contract.DEFAULT_LEAVE_GRACE_SECONDS, id="default"),
        pytest.param(JobBuilder("j").set(leaveGraceSeconds=5), 5, id="set"),
    ],
)
def test_worker_pod_grace_is_leave_grace(builder: JobBuilder, grace: int) -> None:
    pod = manifests.worker_pod(make_job(builder), 0, world_generation=1)
    [trainer] = pod["spec"]["containers"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace
    assert env_of(trainer)[contract.ENV_LEAVE_GRACE_SECONDS] == str(grace)


@pytest.mark.parametrize(
    ("builder", "shared"),
    [
        pytest.param(JobBuilder("j"), True, id="default"),
        pytest.param(JobBuilder("j").pod_spec(shareProcessNamespace=False), False, id="template-says-no"),
    ],
)
def test_the_trainer_is_not_pid_1_unless_the_template_says_so(builder: JobBuilder, shared: bool) -> None:
    """PID 1 discards a signal it has no handler for: a worker deleted while its process starts
    would train on until its grace period ends (docs/trainer.md)."""
    job = make_job(builder)
    assert manifests.worker_pod(job, 0, world_generation=1)["spec"]["shareProcessNamespace"] is shared
    assert manifests.rendezvous_pod(job)["spec"]["shareProcessNamespace"] is True


def test_worker_pod_keeps_the_rest_of_the_template() -> None:
    job = full_job()
    spec = manifests.worker_pod(job, 0, world_generation=1)["spec"]
    assert spec["volumes"] == [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [{"key": "ebbflow.dev/spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("trainer", "high")
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["securityContext"] == {"runAsNonRoot": True}
    trainer, sidecar = spec["containers"]
    assert (trainer["name"], trainer["image"]) == ("trainer", DEFAULT_IMAGE)
    assert trainer["command"] == ["python", "-m", "ebbflow_trainer", "run", "train.py"]
    assert trainer["resources"] == {"limits": {GPU_RESOURCE: 2}, "requests": {"cpu": "4"}}
    assert trainer["volumeMounts"] == [{"name": "ckpt", "mountPath": "/ckpt"}]
    assert (sidecar["name"], sidecar["image"]) == ("sidecar", "busybox")


BY_NAME = {"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}


@pytest.mark.parametrize(
    ("spec", "terms"),
    [
        pytest.param({}, [{"matchFields": [BY_NAME]}], id="no-affinity"),
        pytest.param(
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            [{"matchFields": [BY_NAME]}],
            id="preferred-only",
        ),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [ZONE]}, {"matchFields": [ZONE]}]
                        }
                    }
                }
            },
            [{"matchExpressions": [ZONE], "matchFields": [BY_NAME]}, {"matchFields": [ZONE, BY_NAME]}],
            id="every-required-term-also-names-the-node",
        ),
    ],
)
def test_pin_to_node(spec: dict[str, Any], terms: list[dict[str, Any]]) -> None:
    manifests.pin_to_node(spec, "gpu-7")
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": terms}


def test_worker_pod_pinned_to_a_node_keeps_the_template_and_others_are_not_pinned() -> None:
    job = full_job()
    pinned = manifests.worker_pod(job, 0, world_generation=1, node="gpu-7")["spec"]
    free = manifests.worker_pod(job, 1, world_generation=1)["spec"]
    assert pinned["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [BY_NAME]}]
    }
    assert pinned["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == []
    assert free["affinity"] == {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}


def test_worker_pod_env_contract_and_user_variables() -> None:
    job = full_job()
    trainer, sidecar = manifests.worker_pod(job, 1, world_generation=4)["spec"]["containers"]
    for container in (trainer, sidecar):
        names = env_names(container)
        duplicated = [name for name, count in Counter(names).items() if count > 1]
        assert duplicated == [], f"{container['name']}: {duplicated}"
        assert set(CONTRACT_ENV) <= set(names), container["name"]
    # User variables with contract names are replaced by the operator's values; others are kept.
    assert env_of(trainer)[contract.ENV_VIRTUAL_NODES] == "4"
    assert env_of(trainer)[contract.ENV_RDZV_ID] == "uid-train"
    assert env_of(trainer)["HF_HOME"] == "/cache"
    assert env_of(sidecar)["SIDE"] == "1"
    [pod_name] = [e for e in trainer["env"] if e["name"] == contract.ENV_POD_NAME]
    assert pod_name == {
        "name": contract.ENV_POD_NAME,
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }


@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        pytest.param(
            JobBuilder("j", "ns").replicas(2, 4),
            {
                contract.ENV_JOB_NAME: "j",
                contract.ENV_NAMESPACE: "ns",
                contract.ENV_RDZV_ENDPOINT: f"j-rdzv.j-pods.ns.svc:{contract.RENDEZVOUS_PORT}",
                contract.ENV_RDZV_ID: "uid-j",
                contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS: "600",
                contract.ENV_MIN_REPLICAS: "2",
                contract.ENV_MAX_REPLICAS: "4",
                contract.ENV_VIRTUAL_NODES: "4",
                contract.ENV_GLOBAL_BATCH_SIZE: "256",
                contract.ENV_BATCHING: "static",
                contract.ENV_LR_SCALING: "none",
                contract.ENV_WORLD_GENERATION: "6",
                contract.ENV_CHECKPOINT_PATH: "/checkpoints",
                contract.ENV_CHECKPOINT_INTERVAL_STEPS: "1000",
                contract.ENV_METRICS_PORT: str(contract.METRICS_PORT),
                contract.ENV_LEAVE_GRACE_SECONDS: str(contract.DEFAULT_LEAVE_GRACE_SECONDS),
                contract.ENV_MAX_NONFINITE_STEPS: "3",
                contract.ENV_TERMINATION_MESSAGE_PATH: KUBERNETES_TERMINATION_MESSAGE_PATH,
            },
            id="defaults",
        ),
        pytest.param(
            JobBuilder("j", "ns")
            .replicas(1, 2)
            .virtual_nodes(8)
            .global_batch_size(512)
            .set(
                batching="dynamic",
                lrScaling="sqrt",
                checkpoint={
                    "path": "s3://bucket/ckpt",
                    "intervalSteps": 50,
                    "endpoint": "http://seaweedfs.storage:8333",
                    "credentialsSecret": "checkpoint-store",
                    "retain": 3,
                },
                rendezvous={"port": 31000, "joinTimeoutSeconds": 30},
                leaveGraceSeconds=9,
                maxNonFiniteSteps=7,
            ),
            {
                contract.ENV_RDZV_ENDPOINT: "j-rdzv.j-pods.ns.svc:31000",
                contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS: "30",
                contract.ENV_MIN_REPLICAS: "1",
                contract.ENV_MAX_REPLICAS: "2",
                contract.ENV_VIRTUAL_NODES: "8",
                contract.ENV_GLOBAL_BATCH_SIZE: "512",
                contract.ENV_BATCHING: "dynamic",
                contract.ENV_LR_SCALING: "sqrt",
                contract.ENV_CHECKPOINT_PATH: "s3://bucket/ckpt",
                contract.ENV_CHECKPOINT_INTERVAL_STEPS: "50",
                contract.ENV_CHECKPOINT_ENDPOINT: "http://seaweedfs.storage:8333",
                contract.ENV_CHECKPOINT_RETAIN: "3",
                contract.ENV_LEAVE_GRACE_SECONDS: "9",
                contract.ENV_MAX_NONFINITE_STEPS: "7",
            },
            id="everything-set",
        ),
    ],
)
def test_worker_pod_env_values(builder: JobBuilder, expected: dict[str, str]) -> None:
    [trainer] = manifests.worker_pod(make_job(builder), 0, world_generation=6)["spec"]["containers"]
    env = env_of(trainer)
    assert {name: env.get(name) for name in expected} == expected


def test_object_store_credentials_come_from_the_named_secret_and_never_from_the_spec() -> None:
    checkpoint = {"path": "s3://b/p", "endpoint": "https://s3.example", "credentialsSecret": "store-keys"}
    job = make_job(JobBuilder("j").set(checkpoint=checkpoint))
    [trainer] = manifests.worker_pod(job, 0, world_generation=1)["spec"]["containers"]
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in trainer["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert from_secret == {
        "AWS_ACCESS_KEY_ID": {"name": "store-keys", "key": "AWS_ACCESS_KEY_ID", "optional": False},
        "AWS_SECRET_ACCESS_KEY": {"name": "store-keys", "key": "AWS_SECRET_ACCESS_KEY", "optional": False},
        "AWS_REGION": {"name": "store-keys", "key": "AWS_REGION", "optional": True},
        "AWS_SESSION_TOKEN": {"name": "store-keys", "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    on_volume = manifests.worker_pod(make_job(JobBuilder("j")), 0, world_generation=1)["spec"]["containers"][
        0
    ]
    assert not [e for e in on_volume["env"] if e["name"].startswith("AWS_")]


@pytest.mark.parametrize(
    ("containers", "paths"),
    [
        pytest.param(
            [{"name": "trainer", "image": "t"}],
            [KUBERNETES_TERMINATION_MESSAGE_PATH],
            id="kubernetes-default",
        ),
        pytest.param(
            [
                {"name": "trainer", "image": "t", "terminationMessagePath": "/ebbflow/why"},
                {"name": "sidecar", "image": "s"},
            ],
            ["/ebbflow/why", KUBERNETES_TERMINATION_MESSAGE_PATH],
            id="each-container-its-own",
        ),
        pytest.param(
            [
                {
                    "name": "trainer",
                    "image": "t",
                    "env": [{"name": contract.ENV_TERMINATION_MESSAGE_PATH, "value": "/elsewhere"}],
                }
            ],
            [KUBERNETES_TERMINATION_MESSAGE_PATH],
            id="user-variable-replaced",
        ),
    ],
)
def test_worker_pod_termination_message_path_is_the_containers(
    containers: list[Json], paths: list[str]
) -> None:
    """The trainer writes why it stopped where the kubelet reads it: its container's own path."""
    assert manifests.DEFAULT_TERMINATION_MESSAGE_PATH == KUBERNETES_TERMINATION_MESSAGE_PATH
    job = make_job(JobBuilder("j").pod_spec(containers=containers))
    built = manifests.worker_pod(job, 0, world_generation=1)["spec"]["containers"]
    assert [env_of(c)[contract.ENV_TERMINATION_MESSAGE_PATH] for c in built] == paths
    # The template's own setting stays; none is added where it had none (Kubernetes defaults it).
    assert [c.get("terminationMessagePath") for c in built] == [
        c.get("terminationMessagePath") for c in containers
    ]


@pytest.mark.parametrize(
    ("builder", "virtual_nodes"),
    [
        pytest.param(JobBuilder("j").replicas(1, 1), "1", id="unset-max-1"),
        pytest.param(JobBuilder("j").replicas(2, 6), "6", id="unset-is-max"),
        pytest.param(JobBuilder("j").replicas(2, 6).virtual_nodes(12), "12", id="set-above-max"),
        pytest.param(JobBuilder("j").replicas(2, 6).virtual_nodes(6), "6", id="set-equal-to-max"),
        pytest.param(JobBuilder("j").replicas(1, 3).virtual_nodes(64), "64", id="set-many"),
    ],
)
def test_worker_pod_virtual_nodes_default_to_max(builder: JobBuilder, virtual_nodes: str) -> None:
    job = make_job(builder)
    [trainer] = manifests.worker_pod(job, 0, world_generation=1)["spec"]["containers"]
    assert env_of(trainer)[contract.ENV_VIRTUAL_NODES] == virtual_nodes
    assert int(virtual_nodes) == (job.spec.virtual_nodes or job.spec.replicas.max)


def test_worker_pod_does_not_mutate_the_job() -> None:
    job = full_job()
    template = copy.deepcopy(job.spec.template.to_json())
    first = manifests.worker_pod(job, 0, world_generation=1)
    # Scribble over everything the first pod shares structurally with the template.
    first["metadata"]["labels"]["team"] = "x"
    first["metadata"]["annotations"]["sidecar.istio.io/inject"] = "x"
    first["spec"]["volumes"][0]["name"] = "x"
    first["spec"]["tolerations"].append({"key": "x"})
    first["spec"]["nodeSelector"]["gpu"] = "x"
    first["spec"]["containers"][0]["command"].append("--x")
    first["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = 99
    first["spec"]["containers"][0]["env"].clear()
    assert job.spec.template.to_json() == template
    assert manifests.worker_pod(job, 0, world_generation=1)["spec"]["containers"][0]["command"] == [
        "python",
        "-m",
        "ebbflow_trainer",
        "run",
        "train.py",
    ]
    assert make_job(JobBuilder("j")).spec.template.to_json() == JobBuilder("j").obj()["spec"]["template"]


def test_worker_pod_round_trips_through_the_parser() -> None:
    job = make_job(JobBuilder("j").replicas(1, 4).gpus(3))
    pod = parse_pod(manifests.worker_pod(job, 2, world_generation=8))
    assert (pod.job, pod.role, pod.owner_uid, pod.gpus, pod.world_generation) == (
        "j",
        contract.ROLE_WORKER,
        job.uid,
        3,
        8,
    )


@pytest.mark.parametrize(
    ("template_account", "accounts", "namespace", "expected"),
    [
        pytest.param(None, None, "ns", None, id="no-accounts-leaves-the-default"),
        pytest.param(None, {}, "ns", None, id="empty-accounts-leave-the-default"),
        pytest.param(None, {"ns": "ebbflow-trainer"}, "ns", "ebbflow-trainer", id="namespace-entry"),
        pytest.param(None, {"other": "ebbflow-trainer"}, "ns", None, id="other-namespace-only"),
        pytest.param(None, {"": "trainer"}, "ns", "trainer", id="every-namespace-entry"),
        pytest.param(None, {"": "everywhere", "ns": "here"}, "ns", "here", id="namespace-beats-every"),
        pytest.param("mine", {"ns": "ebbflow-trainer"}, "ns", "mine", id="template-account-wins"),
        pytest.param("mine", {"": "ebbflow-trainer"}, "ns", "mine", id="template-account-wins-every"),
    ],
)
def test_worker_pod_service_account(
    template_account: str | None, accounts: dict[str, str] | None, namespace: str, expected: str | None
) -> None:
    builder = JobBuilder("j", namespace)
    if template_account is not None:
        builder = builder.pod_spec(serviceAccountName=template_account)
    job = make_job(builder)
    spec = manifests.worker_pod(job, 0, world_generation=1, service_accounts=accounts)["spec"]
    assert spec.get("serviceAccountName") == expected


@pytest.mark.parametrize(
    ("argv", "environment", "expected"),
    [
        pytest.param([], "", [], id="default-none"),
        pytest.param(["--trainer-service-account", "ml/runner"], "", [("ml", "runner")], id="namespaced"),
        pytest.param(["--trainer-service-account=runner"], "", [("", "runner")], id="every-namespace"),
        pytest.param(
            ["--trainer-service-account=a/x", "--trainer-service-account=b/y"],
            "",
            [("a", "x"), ("b", "y")],
            id="repeated",
        ),
        pytest.param([], "a/x,b/x", [("a", "x"), ("b", "x")], id="environment"),
    ],
)
def test_trainer_service_account_flag(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], environment: str, expected: list[tuple[str, str]]
) -> None:
    from ebbflow_operator.__main__ import parse_args

    monkeypatch.setenv("EBBFLOW_OPERATOR_TRAINER_SERVICE_ACCOUNT", environment)
    assert parse_args(argv).trainer_service_account == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Team/runner", id="namespace-uppercase"),
        pytest.param("ml/", id="no-name"),
        pytest.param("a/b/c", id="two-slashes"),
        pytest.param("ml/runner_1", id="underscore"),
    ],
)
def test_trainer_service_account_flag_refuses_bad_names(value: str) -> None:
    from ebbflow_operator.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--trainer-service-account", value])


@pytest.mark.parametrize(
    ("argv", "environment", "expected"),
    [
        pytest.param([], "", 500, id="default"),
        pytest.param([], "50", 50, id="environment"),
        pytest.param(["--max-writes-per-pass", "2000"], "50", 2000, id="flag-over-environment"),
    ],
)
def test_max_writes_per_pass_flag(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], environment: str, expected: int
) -> None:
    from ebbflow_operator.__main__ import parse_args

    if environment:
        monkeypatch.setenv("EBBFLOW_OPERATOR_MAX_WRITES_PER_PASS", environment)
    assert parse_args(argv).max_writes_per_pass == expected


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "many"])
def test_max_writes_per_pass_flag_refuses_what_is_not_a_count(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ebbflow_operator.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--max-writes-per-pass", value])
    assert "--max-writes-per-pass" in capsys.readouterr().err


# --- rendezvous_pod ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "image", "command"),
    [
        pytest.param(
            JobBuilder("j"),
            DEFAULT_IMAGE,
            [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, str(contract.RENDEZVOUS_PORT)],
            id="defaults",
        ),
        pytest.param(
            JobBuilder("j").image("registry/trainer:v2"),
            "registry/trainer:v2",
            [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, str(contract.RENDEZVOUS_PORT)],
            id="image-from-worker-template",
        ),
        pytest.param(
            JobBuilder("j").pod_spec(
                containers=[
                    {"name": "trainer", "image": "first:1"},
                    {"name": "sidecar", "image": "second:1"},
                ]
            ),
            "first:1",
            [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, str(contract.RENDEZVOUS_PORT)],
            id="first-worker-image",
        ),
        pytest.param(
            JobBuilder("j").set(rendezvous={"port": 31000}),
            DEFAULT_IMAGE,
            [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, "31000"],
            id="port-flag-follows-port",
        ),
        pytest.param(
            JobBuilder("j").set(rendezvous={"image": "rdzv:1"}),
            "rdzv:1",
            [*contract.RENDEZVOUS_COMMAND, contract.RENDEZVOUS_PORT_FLAG, str(contract.RENDEZVOUS_PORT)],
            id="image-override",
        ),
        pytest.param(
            JobBuilder("j").set(rendezvous={"command": ["my-store", "--listen", "29400"]}),
            DEFAULT_IMAGE,
            ["my-store", "--listen", "29400"],
            id="command-override",
        ),
        pytest.param(
            JobBuilder("j").set(rendezvous={"image": "rdzv:1", "command": ["serve"], "port": 30000}),
            "rdzv:1",
            ["serve"],
            id="both-overridden",
        ),
    ],
)
def test_rendezvous_pod_image_and_command(builder: JobBuilder, image: str, command: list[str]) -> None:
    job = make_job(builder)
    pod = manifests.rendezvous_pod(job)
    [rdzv] = pod["spec"]["containers"]
    assert (rdzv["image"], rdzv["command"]) == (image, command)
    port = job.spec.rendezvous.port
    declarations = manifests.declarations_port(job)
    assert rdzv["ports"] == [
        {"name": "c10d", "containerPort": port},
        {"name": "declarations", "containerPort": declarations},
    ]
    assert env_of(rdzv) == {
        contract.ENV_JOB_NAME: "j",
        contract.ENV_NAMESPACE: job.namespace,
        contract.ENV_RDZV_ID: job.uid,
        contract.ENV_RDZV_PORT: str(port),
        contract.ENV_MIN_REPLICAS: str(job.spec.replicas.min),
        contract.ENV_MAX_REPLICAS: str(job.spec.replicas.max),
        contract.ENV_DECLARATIONS_PORT: str(declarations),
    }


@pytest.mark.parametrize(
    ("port", "declarations"),
    [
        pytest.param(contract.RENDEZVOUS_PORT, contract.DECLARATIONS_PORT, id="default"),
        pytest.param(contract.DECLARATIONS_PORT, contract.DECLARATIONS_PORT + 1, id="store-on-its-port"),
    ],
)
def test_the_declarations_port_never_is_the_stores(port: int, declarations: int) -> None:
    assert (
        manifests.declarations_port(make_job(JobBuilder("j").set(rendezvous={"port": port}))) == declarations
    )


def test_the_rendezvous_pod_reads_its_token_from_the_jobs_secret_which_holds_none_in_a_plan() -> None:
    job = make_job(JobBuilder("j"))
    [rdzv] = manifests.rendezvous_pod(job)["spec"]["containers"]
    [token] = [e for e in rdzv["env"] if e["name"] == contract.ENV_RDZV_TOKEN]
    reference = {
        "name": manifests.rendezvous_token_name("j"),
        "key": contract.RDZV_TOKEN_KEY,
        "optional": True,
    }
    assert token == {"name": contract.ENV_RDZV_TOKEN, "valueFrom": {"secretKeyRef": reference}}
    secret = manifests.rendezvous_token_secret(job)
    assert secret["metadata"]["name"] == manifests.rendezvous_token_name("j")
    assert secret["metadata"]["ownerReferences"] == [manifests.owner_reference(job)]
    assert "data" not in secret and "stringData" not in secret


def test_rendezvous_pod_default_command_is_understood_by_the_trainer_cli() -> None:
    """The default command (after the console script's name) parses as the trainer's rendezvous command."""
    from ebbflow_trainer.__main__ import _parser  # the trainer CLI needs no torch to parse arguments

    [rdzv] = manifests.rendezvous_pod(make_job(JobBuilder("j").set(rendezvous={"port": 31000})))["spec"][
        "containers"
    ]
    script, *argv = rdzv["command"]
    assert script == "ebbflow-train"  # trainer-image/pyproject.toml [project.scripts]
    args = _parser().parse_args(argv)
    assert (args.command, args.port) == ("rendezvous", 31000)


def test_rendezvous_pod_placement_and_no_gpu() -> None:
    job = full_job()
    pod = manifests.rendezvous_pod(job)
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [{"key": "ebbflow.dev/spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == job.spec.template.spec.to_json()["affinity"]
    assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("trainer", "high")
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["restartPolicy"] == "Always"
    assert "volumes" not in spec
    [rdzv] = spec["containers"]
    assert rdzv["image"] == DEFAULT_IMAGE
    resources = rdzv["resources"]
    assert GPU_RESOURCE not in resources.get("limits", {})
    assert GPU_RESOURCE not in resources.get("requests", {})
    assert parse_pod(pod).gpus == 0
    metadata = pod["metadata"]
    assert (metadata["name"], metadata["namespace"]) == ("train-rdzv", "ml")
    assert metadata["labels"] == {
        contract.LABEL_JOB_NAME: "train",
        contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS,
    }
    assert metadata["ownerReferences"] == [manifests.owner_reference(job)]
    assert metadata["ownerReferences"][0]["controller"] is True


def test_rendezvous_pod_without_placement_sets_none() -> None:
    spec = manifests.rendezvous_pod(make_job(JobBuilder("j")))["spec"]
    assert not {"nodeSelector", "tolerations", "affinity"} & set(spec)


# --- services ------------------------------------------------------------------------------------


def selects(service: Json, pod: Json) -> bool:
    selector = service["spec"]["selector"]
    return bool(selector) and selector.items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("builder", "port"),
    [
        pytest.param(JobBuilder("j"), contract.RENDEZVOUS_PORT, id="default-port"),
        pytest.param(JobBuilder("j").set(rendezvous={"port": 31000}), 31000, id="port-set"),
    ],
)
def test_job_service(builder: JobBuilder, port: int) -> None:
    job = make_job(builder)
    service = manifests.job_service(job)
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert service["metadata"]["name"] == manifests.service_name("j") == "j-pods"
    assert service["metadata"]["ownerReferences"] == [manifests.owner_reference(job)]
    assert service["spec"]["clusterIP"] == "None"  # headless: each pod its own DNS name
    assert service["spec"]["publishNotReadyAddresses"] is True  # a starting store is found at once
    assert service["spec"]["ports"] == [{"name": "c10d", "port": port, "targetPort": port}]
    rendezvous = manifests.rendezvous_pod(job)
    worker = manifests.worker_pod(job, 0, world_generation=1)
    for pod in (rendezvous, worker):
        assert selects(service, pod)
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert not selects(service, manifests.worker_pod(make_job(JobBuilder("other")), 0, world_generation=1))
    # The workers' endpoint is the rendezvous pod's name under this Service, never a worker's.
    assert rendezvous["spec"]["hostname"] == "j-rdzv" != worker["spec"]["hostname"]
    assert manifests.rendezvous_endpoint(job) == f"j-rdzv.j-pods.{job.namespace}.svc:{port}"
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_RDZV_ENDPOINT] == manifests.rendezvous_endpoint(job)


def test_network_policy_admits_only_the_jobs_pods_but_the_metrics_and_declarations_ports() -> None:
    job, other = make_job(JobBuilder("j")), make_job(JobBuilder("other"))
    policy = manifests.network_policy(job)
    assert policy["metadata"]["name"] == manifests.network_policy_name("j")
    assert policy["metadata"]["ownerReferences"] == [manifests.owner_reference(job)]
    assert policy["metadata"]["labels"] == {contract.LABEL_JOB_NAME: "j"}
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    protected = {"spec": {"selector": spec["podSelector"]["matchLabels"]}}
    worker, rendezvous = manifests.worker_pod(job, 0, world_generation=1), manifests.rendezvous_pod(job)
    stranger = manifests.worker_pod(other, 0, world_generation=1)
    assert selects(protected, worker) and selects(protected, rendezvous)
    assert not selects(protected, stranger)
    from_pods, metrics, declarations = spec["ingress"]
    admitted = {"spec": {"selector": from_pods["from"][0]["podSelector"]["matchLabels"]}}
    assert set(from_pods) == {"from"}, "the job's own pods reach every port"
    assert selects(admitted, worker) and selects(admitted, rendezvous)
    assert not selects(admitted, stranger)
    assert metrics == {"ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]}, "metrics from anywhere"
    port = manifests.declarations_port(job)
    assert declarations == {"ports": [{"protocol": "TCP", "port": port}]}, "the operator's declarations"


def test_rendezvous_pod_meets_the_restricted_pod_security_standard() -> None:
    spec = manifests.rendezvous_pod(make_job(JobBuilder("j")))["spec"]
    pod, container = spec["securityContext"], spec["containers"][0]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_worker_selector_matches_worker_labels() -> None:
    job = make_job(JobBuilder("j"))
    labels = manifests.worker_pod(job, 5, world_generation=1)["metadata"]["labels"]
    terms = dict(term.split("=", 1) for term in manifests.worker_selector("j").split(","))
    assert terms == {contract.LABEL_JOB_NAME: "j", contract.LABEL_ROLE: contract.ROLE_WORKER}
    assert terms.items() <= labels.items()


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "index"),
    [
        pytest.param("j", 0, id="zero"),
        pytest.param("train", 7, id="simple"),
        pytest.param("my-job", 1023, id="large-index"),
        pytest.param("a-worker-b", 3, id="job-name-contains-worker"),
        pytest.param("j-worker-1", 2, id="job-name-looks-like-a-worker"),
        pytest.param("x" * 40, 12, id="longest-job-name"),
    ],
)
def test_worker_name_round_trip(job: str, index: int) -> None:
    name = manifests.worker_name(job, index)
    assert name == f"{job}-worker-{index}"
    assert manifests.worker_index(name) == index


def test_longest_names_fit_kubernetes_limits() -> None:
    """MAX_JOB_NAME_LENGTH leaves room for every derived name (63 characters for DNS labels)."""
    job = "j" * MAX_JOB_NAME_LENGTH
    names = [
        manifests.worker_name(job, MAX_REPLICAS - 1),
        manifests.rendezvous_name(job),
        manifests.service_name(job),
        manifests.rendezvous_host(job, "n" * 63),
    ]
    assert max(len(label) for name in names for label in name.split(".")) <= 63


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("j-rdzv", id="rendezvous"),
        pytest.param("j-pods", id="service"),
        pytest.param("j-worker-", id="no-index"),
        pytest.param("j-worker-x", id="non-numeric-index"),
        pytest.param("j-worker-1a", id="index-with-suffix"),
        pytest.param("worker-1", id="no-job-prefix"),
        pytest.param("-worker-1", id="empty-job"),
        pytest.param("", id="empty"),
    ],
)
def test_worker_index_of_other_names(name: str) -> None:
    assert manifests.worker_index(name) is None
