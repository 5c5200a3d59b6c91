"""The ElasticTrainingJob CustomResourceDefinition: the one source of truth for the API.

The committed `crds/ebbflow.dev_elastictrainingjobs.yaml` is generated from `crd_manifest()`
(`python -m ebbflow_operator.crd > crds/ebbflow.dev_elastictrainingjobs.yaml`); a unit test fails
when the two drift. Defaults live here only: the API server applies them, so the operator reads
defaulted objects. Validation is the API server's too (structural schema + CEL), with messages
that name the field and the fix.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from ebbflow_trainer import contract

CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"
CLEAN_POD_POLICIES = ("Running", "All", "None")
PHASES = ("Pending", "Running", "Scaling", "Succeeded", "Failed")

# Upper bounds that catch typos (an extra zero) rather than limit real jobs.
MAX_REPLICAS = 1024
MAX_VIRTUAL_NODES = 65536
MAX_GLOBAL_BATCH_SIZE = 1 << 24
MAX_PRIORITY = 1_000_000
MAX_RESTARTS = 1000
MAX_LEAVE_GRACE_SECONDS = 3600
MAX_JOB_NAME_LENGTH = 40  # leaves room for "-worker-NNNN" in 63-character pod and Service names
MAX_GPUS_PER_WORKER = 64

Schema = dict[str, Any]


def _int(minimum: int, maximum: int, description: str, default: int | None = None) -> Schema:
    schema: Schema = {
        "type": "integer",
        "format": "int32",
        "minimum": minimum,
        "maximum": maximum,
        "description": description,
    }
    if default is not None:
        schema["default"] = default
    return schema


def _string(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def _resource_map(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": 16,
        "additionalProperties": {"x-kubernetes-int-or-string": True},
        "x-kubernetes-validations": [
            {
                "rule": "!('nvidia.com/gpu' in self) || (type(self['nvidia.com/gpu']) == int ? "
                f"self['nvidia.com/gpu'] >= 0 && self['nvidia.com/gpu'] <= {MAX_GPUS_PER_WORKER} : "
                f"self['nvidia.com/gpu'] in {[str(n) for n in range(MAX_GPUS_PER_WORKER + 1)]})",
                "message": f"nvidia.com/gpu must be a whole number of GPUs between 0 and "
                f"{MAX_GPUS_PER_WORKER}; use time-slicing replicas for fractions",
            }
        ],
    }


def _container() -> Schema:
    return {
        "type": "object",
        "required": ["name", "image"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "name": _string("Container name.", minLength=1, maxLength=63),
            "image": _string(
                "Container image (the trainer image for the trainer container).", minLength=1, maxLength=512
            ),
            "resources": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {
                    "limits": _resource_map("Resource limits; nvidia.com/gpu is the GPUs each worker needs."),
                    "requests": _resource_map("Resource requests."),
                },
            },
        },
    }


def _template() -> Schema:
    return {
        "type": "object",
        "description": "The worker PodTemplateSpec. The operator adds the contract's labels and environment, "
        "sets restartPolicy Never and terminationGracePeriodSeconds to leaveGraceSeconds.",
        "required": ["spec"],
        "properties": {
            "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "spec": {
                "type": "object",
                "required": ["containers"],
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {
                    "containers": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 8,
                        "items": _container(),
                        "x-kubernetes-validations": [
                            {
                                "rule": "self.all(c, size(c.image) > 0)",
                                "message": "every container needs an image: set "
                                "spec.template.spec.containers[].image",
                            }
                        ],
                    },
                },
            },
        },
    }


def _spec() -> Schema:
    return {
        "type": "object",
        "required": ["template", "replicas", "globalBatchSize"],
        "properties": {
            "template": _template(),
            "replicas": {
                "type": "object",
                "description": "Worker count bounds; the operator picks the size in [min, max] that fits.",
                "required": ["min", "max"],
                "properties": {
                    "min": _int(1, MAX_REPLICAS, "Fewest workers the job can train with."),
                    "max": _int(1, MAX_REPLICAS, "Most workers the job can use; `kubectl scale` sets it."),
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "self.min <= self.max",
                        "message": "spec.replicas.min must be <= spec.replicas.max: lower min or raise max",
                    }
                ],
            },
            "virtualNodes": _int(
                1, MAX_VIRTUAL_NODES, "V, the fixed number of virtual nodes (default: replicas.max); >= max."
            ),
            "globalBatchSize": _int(1, MAX_GLOBAL_BATCH_SIZE, "B, samples per step; a multiple of V."),
            "batching": _string(
                "static: B/V samples per virtual node; dynamic: rebalance by measured throughput.",
                enum=list(contract.BATCHING_POLICIES),
                default=contract.BATCHING_POLICIES[0],
            ),
            "lrScaling": _string(
                "Learning-rate scaling when the global batch changes.",
                enum=list(contract.LR_SCALING_POLICIES),
                default=contract.LR_SCALING_POLICIES[0],
            ),
            "checkpoint": {
                "type": "object",
                "default": {},
                "properties": {
                    "path": _string(
                        "Where durable checkpoints go: an absolute path on a shared volume or a URL.",
                        default="/checkpoints",
                        maxLength=1024,
                        pattern="^(/|[a-z][a-z0-9+.-]*://).+",
                    ),
                    "intervalSteps": _int(1, 10_000_000, "Steps between durable checkpoints.", default=1000),
                },
            },
            "priority": _int(
                -MAX_PRIORITY, MAX_PRIORITY, "Higher-priority jobs get GPUs first (up to their max).", 0
            ),
            "maxRestarts": _int(
                0, MAX_RESTARTS, "Real worker failures (not preemptions) tolerated before Failed.", 3
            ),
            "leaveGraceSeconds": _int(
                1,
                MAX_LEAVE_GRACE_SECONDS,
                "Seconds a worker gets after SIGTERM to hand its state over before it is killed.",
                contract.DEFAULT_LEAVE_GRACE_SECONDS,
            ),
            "cleanPodPolicy": _string(
                "Which pods are deleted when the job ends: Running (unfinished pods and the rendezvous "
                "pod; finished workers stay for their logs), All, or None.",
                enum=list(CLEAN_POD_POLICIES),
                default=CLEAN_POD_POLICIES[0],
            ),
            "rendezvous": {
                "type": "object",
                "default": {},
                "description": "The rendezvous pod (CPU only) that hosts the c10d store.",
                "properties": {
                    "port": _int(1024, 65535, "TCP port of the c10d store.", contract.RENDEZVOUS_PORT),
                    "joinTimeoutSeconds": _int(
                        10, 86400, "Seconds a worker waits for a rendezvous round before giving up.", 600
                    ),
                    "image": _string(
                        "Image of the rendezvous pod (default: the first worker image).", minLength=1
                    ),
                    "command": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": 64,
                        "description": "Command of the rendezvous pod (default: the contract's).",
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.virtualNodes) || self.virtualNodes >= self.replicas.max",
                "message": "spec.virtualNodes must be >= spec.replicas.max: raise virtualNodes or lower max",
                "reason": "FieldValueInvalid",
                "fieldPath": ".virtualNodes",
            },
            {
                "rule": "self.globalBatchSize % "
                "(has(self.virtualNodes) ? self.virtualNodes : self.replicas.max) == 0",
                "message": "spec.globalBatchSize must be a multiple of spec.virtualNodes (or of "
                "spec.replicas.max when virtualNodes is unset): round it to a multiple",
                "reason": "FieldValueInvalid",
                "fieldPath": ".globalBatchSize",
            },
        ],
    }


def _condition() -> Schema:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "observedGeneration": {"type": "integer", "format": "int64"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
        },
    }


def _status() -> Schema:
    progress: Schema = {
        "type": "object",
        "description": "Latest report of the trainers (rank 0).",
        "properties": {
            "step": {"type": "integer", "format": "int64"},
            "samples": {"type": "integer", "format": "int64"},
            "loss": {"type": "number"},
            "samplesPerSecond": {"type": "number"},
            "time": {"type": "string"},
        },
    }
    assert tuple(progress["properties"]) == contract.PROGRESS_FIELDS
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "conditions": {
                "type": "array",
                "items": _condition(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "observedGeneration": {"type": "integer", "format": "int64"},
            "replicas": {"type": "integer", "description": "Worker pods that exist and are not leaving."},
            "readyReplicas": {"type": "integer", "description": "Workers running and ready."},
            "desiredReplicas": {"type": "integer", "description": "The allocator's size for the job."},
            "selector": {"type": "string", "description": "Label selector of the worker pods."},
            "worldGeneration": {"type": "integer", "format": "int64"},
            "lastRescale": {
                "type": "object",
                "properties": {
                    "time": {"type": "string", "format": "date-time"},
                    "from": {"type": "integer"},
                    "to": {"type": "integer"},
                    "reason": {"type": "string"},
                },
            },
            "preemptions": {"type": "integer", "format": "int64"},
            "restarts": {"type": "integer", "format": "int64"},
            "workerNodes": {
                "type": "object",
                "description": "Worker pods as last observed (or just created) and their nodes ('' "
                "while unscheduled); a bound worker that vanishes from here without the operator "
                "deleting it was preempted.",
                "additionalProperties": {"type": "string"},
            },
            "holdReplicas": {
                "type": "integer",
                "description": "After a pending timeout the job stays at most this big until holdUntil.",
            },
            "holdUntil": {"type": "string", "format": "date-time"},
            "startTime": {"type": "string", "format": "date-time"},
            "completionTime": {"type": "string", "format": "date-time"},
            "progress": progress,
        },
    }


def _printer_columns() -> list[Schema]:
    def column(name: str, kind: str, path: str) -> Schema:
        return {"name": name, "type": kind, "jsonPath": path}

    return [
        column("Min", "integer", ".spec.replicas.min"),
        column("Max", "integer", ".spec.replicas.max"),
        column("Desired", "integer", ".status.desiredReplicas"),
        column("Ready", "integer", ".status.readyReplicas"),
        column("Phase", "string", ".status.phase"),
        column("Age", "date", ".metadata.creationTimestamp"),
    ]


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition as a plain dict, ready for YAML or the API."""
    root: Schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec(),
            "status": _status(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH}",
                "message": f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters (pod and "
                "Service names are derived from it): choose a shorter name",
            },
            {
                "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "message": "metadata.name must start with a letter and contain only lowercase letters, "
                "digits and '-' (it names Services): rename the job",
            },
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": contract.API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": contract.KIND.lower(),
                "shortNames": [contract.SHORT_NAME],
                "categories": ["ebbflow"],
            },
            "versions": [
                {
                    "name": contract.API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas.max",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML committed under crds/."""
    header = (
        "# Generated by `python -m ebbflow_operator.crd`; edit operator/ebbflow_operator/crd.py instead.\n"
    )
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
