"""Trainer configuration: the contract's environment plus launcher flags, validated before anything starts.

Every check names the setting and the fix, because a bad setting can only be repaired by a person:
the launcher exits with ``contract.EXIT_INVALID_CONFIG`` and the operator fails the job instead of
restarting it forever. What the trainer shares with the job's spec (V, B, min/max, batching, LR
scaling, the largest global batch, the join timeout) is checked and defaulted by the API models
themselves (`TrainingShape` and its CEL rules), so the trainer and the API server can never disagree.

Batch-size co-adaptation (see :mod:`.global_batch`) is on exactly when
``contract.ENV_MAX_GLOBAL_BATCH_SIZE`` is set. ``contract.ENV_GLOBAL_BATCH_SIZE_FILE`` without it is
accepted and never read (the operator may project the annotation into every pod), so B stays
``globalBatchSize``; with it but without a file, nothing can ask for another B, so B stays too.
A global batch the policy asks for is checked by :func:`batch_violation` with the same rules.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ebbflow_api import contract
from ebbflow_api.models import (
    MAX_NON_FINITE_STEPS,
    BandLimit,
    Batching,
    ElasticTrainingJobSpec,
    LrScaling,
    RendezvousSpec,
    TrainingShape,
    rule_violations,
)
from pydantic import ValidationError

MODES = ("deterministic", "fast")
# Collective backends: auto is nccl when CUDA is available, else gloo (see collectives.resolve_backend).
BACKENDS = ("auto", "nccl", "gloo")
ROW_TABLE_LIMIT = 2 << 20  # bytes: the measured crossover lies between 1.3 and 4.4 MB (bench/README.md)
DEFAULT_JOIN_TIMEOUT = RendezvousSpec().join_timeout_seconds
DEFAULT_MAX_NONFINITE_STEPS: int = ElasticTrainingJobSpec.model_fields["max_non_finite_steps"].default
# The spec fields the trainer receives, by the variable the operator passes each in.
SHAPE_VARIABLES = {
    "replicas.min": contract.ENV_MIN_REPLICAS,
    "replicas.max": contract.ENV_MAX_REPLICAS,
    "virtualNodes": contract.ENV_VIRTUAL_NODES,
    "globalBatchSize": contract.ENV_GLOBAL_BATCH_SIZE,
    "batching": contract.ENV_BATCHING,
    "lrScaling": contract.ENV_LR_SCALING,
    "maxGlobalBatchSize": contract.ENV_MAX_GLOBAL_BATCH_SIZE,
    "momentumCorrection": contract.ENV_MOMENTUM_CORRECTION,
}


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says how to fix it."""


@dataclass(frozen=True)
class TrainerConfig:
    """Everything a launcher and its workers need, resolved once by the launcher."""

    # `run`: the TrainingSpec script; `torchrun`: the script torchrun would run, with its arguments.
    spec: str
    rdzv_endpoint: str
    rdzv_id: str
    min_replicas: int
    max_replicas: int
    virtual_nodes: int
    global_batch_size: int
    batching: str = Batching.STATIC.value
    lr_scaling: str = LrScaling.NONE.value
    momentum_correction: bool = False  # spec.momentumCorrection (see lr_scaling.MomentumCorrection)
    # spec.maxGlobalBatchSize (None: B never changes) and the file holding the B the policy chose.
    max_global_batch_size: int | None = None
    global_batch_size_file: str = ""
    # spec.bandLimit: band-limited convolutions up to this rate, and the file holding the memory budget.
    band_limit: bool = False
    max_compression_rate: float = 0.75
    memory_budget_file: str = ""
    mode: str = "deterministic"
    # Training processes per pod, all members of the same elastic world (one per visible GPU by default).
    nproc_per_node: int = 1
    backend: str = "auto"
    # Deterministic mode all-reduces one row per virtual node while those V rows take at most this many
    # bytes, exact sums above (engine.VirtualNodeEngine.method); 0 always uses exact sums.
    row_table_limit: int = ROW_TABLE_LIMIT
    # Fast mode all-reduces gradients in buckets of about this many MiB (DDP's bucket_cap_mb).
    bucket_mb: float = 25.0
    seed: int = 0
    steps: int | None = None
    base_batch_size: int | None = None
    checkpoint_path: str = ""
    checkpoint_interval_steps: int = 0
    checkpoint_endpoint: str = ""  # with an s3:// checkpoint path (launch/object_checkpoints.py)
    checkpoint_retain: int = contract.DEFAULT_CHECKPOINT_RETAIN
    metrics_port: int = contract.METRICS_PORT
    leave_grace_seconds: int = contract.DEFAULT_LEAVE_GRACE_SECONDS
    max_nonfinite_steps: int = DEFAULT_MAX_NONFINITE_STEPS
    termination_message_path: str = ""
    pod_name: str = ""
    namespace: str = ""
    state_dir: str = ""
    journal: str = ""
    node_addr: str = ""
    # Rendezvous and failure-detection timeouts: short, so a re-formed world trains again in seconds.
    join_timeout: float = float(DEFAULT_JOIN_TIMEOUT)
    last_call_timeout: float = 1.0
    # A heartbeat every second; a node silent for 10 of them is dead (docs/trainer.md, "Membership
    # changes"). A false death re-forms the whole world and, on an overloaded node, again and again
    # (3 s did that on a loaded CI machine); a true one (SIGKILL) only waits the budget out once.
    keep_alive_interval: float = 1.0
    keep_alive_max_attempt: int = 10
    store_timeout: float = 60.0
    # How long a launcher waits for a new rendezvous store after losing it (see .rendezvous).
    store_loss_timeout: float = 300.0
    collective_timeout: float = 60.0
    monitor_interval: float = 0.2
    max_restarts: int = 1_000_000
    # Dynamic batching: relative change below which a reassignment is not worth applying.
    dead_band: float = 0.2
    progress_interval_seconds: float = 5.0
    # Simulated accelerator time per virtual node (CPU tests and benchmarks model devices with it).
    simulated_vnode_seconds: float = 0.0
    # Simulated interconnect: seconds every step of a world of two or more spends in its collective.
    simulated_sync_seconds: float = 0.0
    slowdown: float = 1.0
    script_args: tuple[str, ...] = ()

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 2**20))

    @property
    def rdzv_host(self) -> str:
        return self.rdzv_endpoint.rsplit(":", 1)[0]

    @property
    def rdzv_port(self) -> int:
        return int(self.rdzv_endpoint.rsplit(":", 1)[1])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        values = json.loads(text)
        values["script_args"] = tuple(values.get("script_args", ()))
        return cls(**values)


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "")
    if raw == "":
        if default is None:
            raise ConfigError(f"{name} is not set: set it to a positive integer (the operator sets it).")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer: set it to a whole number.") from None


def _env_optional_int(env: Mapping[str, str], name: str) -> int | None:
    """An integer variable the operator leaves out when its spec field is unset."""
    return _env_int(env, name) if env.get(name, "") != "" else None


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number: write it like 0.5.") from None


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    """A switch the operator sets to "true" when its spec field is on and leaves out otherwise."""
    raw = env.get(name, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ConfigError(f"{name}={env[name]!r} must be true or false (or unset: false).")
    return raw == "true"


def visible_gpus() -> int:
    """CUDA devices this container sees (the pod's nvidia.com/gpu limit), 0 without CUDA."""
    import torch  # lazily: parsing the command line must not load torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def from_environment(env: Mapping[str, str], *, gpus: int | None = None, **flags: object) -> TrainerConfig:
    """Build and validate the configuration from the contract's variables and the launcher's flags.
    ``gpus``: the CUDA devices visible (default: asked of torch); it defaults ``nproc_per_node``."""
    if gpus is None:
        gpus = visible_gpus()
    if flags.get("nproc_per_node") is None:
        flags["nproc_per_node"] = max(1, gpus)
    endpoint = env.get(contract.ENV_RDZV_ENDPOINT, "")
    state_dir = str(flags.pop("state_dir", "") or "")
    if flags.get("join_timeout") is None:
        flags["join_timeout"] = float(
            _env_int(env, contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS, DEFAULT_JOIN_TIMEOUT)
        )
    rdzv_id = env.get(contract.ENV_RDZV_ID, "") or env.get(contract.ENV_JOB_NAME, "")
    if not state_dir:
        shm = Path("/dev/shm")
        root = shm if shm.is_dir() else Path(tempfile.gettempdir())
        state_dir = str(root / "ebbflow" / (rdzv_id or "default"))
    config = TrainerConfig(
        rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id,
        min_replicas=_env_int(env, contract.ENV_MIN_REPLICAS, 1),
        max_replicas=_env_int(env, contract.ENV_MAX_REPLICAS, 1),
        virtual_nodes=_env_int(env, contract.ENV_VIRTUAL_NODES),
        global_batch_size=_env_int(env, contract.ENV_GLOBAL_BATCH_SIZE),
        batching=env.get(contract.ENV_BATCHING, "") or Batching.STATIC.value,
        lr_scaling=env.get(contract.ENV_LR_SCALING, "") or LrScaling.NONE.value,
        momentum_correction=_env_bool(env, contract.ENV_MOMENTUM_CORRECTION),
        max_global_batch_size=_env_optional_int(env, contract.ENV_MAX_GLOBAL_BATCH_SIZE),
        global_batch_size_file=env.get(contract.ENV_GLOBAL_BATCH_SIZE_FILE, ""),
        band_limit=_env_bool(env, contract.ENV_BAND_LIMIT),
        max_compression_rate=_env_float(env, contract.ENV_MAX_COMPRESSION_RATE, 0.75),
        memory_budget_file=env.get(contract.ENV_MEMORY_BUDGET_FILE, ""),
        checkpoint_path=env.get(contract.ENV_CHECKPOINT_PATH, ""),
        checkpoint_interval_steps=_env_int(env, contract.ENV_CHECKPOINT_INTERVAL_STEPS, 0),
        checkpoint_endpoint=env.get(contract.ENV_CHECKPOINT_ENDPOINT, ""),
        checkpoint_retain=_env_int(env, contract.ENV_CHECKPOINT_RETAIN, contract.DEFAULT_CHECKPOINT_RETAIN),
        metrics_port=_env_int(env, contract.ENV_METRICS_PORT, contract.METRICS_PORT),
        leave_grace_seconds=_env_int(
            env, contract.ENV_LEAVE_GRACE_SECONDS, contract.DEFAULT_LEAVE_GRACE_SECONDS
        ),
        max_nonfinite_steps=_env_int(env, contract.ENV_MAX_NONFINITE_STEPS, DEFAULT_MAX_NONFINITE_STEPS),
        termination_message_path=env.get(contract.ENV_TERMINATION_MESSAGE_PATH, ""),
        pod_name=env.get(contract.ENV_POD_NAME, ""),
        namespace=env.get(contract.ENV_NAMESPACE, ""),
        state_dir=state_dir,
        **flags,  # type: ignore[arg-type]
    )
    validate(config)
    check_devices(config, gpus)
    return config


def validate(config: TrainerConfig) -> None:
    """Reject settings that cannot train correctly, naming the setting and the fix."""
    endpoint = config.rdzv_endpoint
    if not endpoint:
        raise ConfigError(
            f"{contract.ENV_RDZV_ENDPOINT} is not set: set it to host:port of the job's rendezvous "
            "service (started with `ebbflow-train rendezvous`)."
        )
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{contract.ENV_RDZV_ENDPOINT}={endpoint!r} is not host:port: write it like rdzv:29400."
        )
    if not config.rdzv_id:
        raise ConfigError(
            f"{contract.ENV_RDZV_ID} is not set: set it to an id unique to this job incarnation, so a "
            "recreated job never joins an old rendezvous round."
        )
    _check_shape(config)
    _check_band_limit(config)
    _check_processes(config)
    if config.mode not in MODES:
        raise ConfigError(f"--mode={config.mode!r} must be one of {MODES}.")
    if config.row_table_limit < 0:
        raise ConfigError(f"--row-table-limit={config.row_table_limit} must be 0 or a number of bytes.")
    if not (config.bucket_mb > 0 and math.isfinite(config.bucket_mb)):
        raise ConfigError(f"--bucket-mb={config.bucket_mb} must be a positive number of MiB (DDP uses 25).")
    if config.checkpoint_interval_steps < 0:
        raise ConfigError(
            f"{contract.ENV_CHECKPOINT_INTERVAL_STEPS} must be 0 (off) or a positive step count."
        )
    if config.checkpoint_retain < 1:
        raise ConfigError(f"{contract.ENV_CHECKPOINT_RETAIN} (spec.checkpoint.retain) must be 1 or more.")
    if config.steps is not None and config.steps < 1:
        raise ConfigError(f"--steps={config.steps} must be positive.")
    if config.base_batch_size is not None and config.base_batch_size < 1:
        raise ConfigError(f"--base-batch-size={config.base_batch_size} must be positive.")
    if not 0 < config.dead_band < 1:
        raise ConfigError(f"--dead-band={config.dead_band} must lie strictly between 0 and 1.")
    timeouts = ("last_call_timeout", "keep_alive_interval", "collective_timeout")
    for name in (*timeouts, "store_timeout", "store_loss_timeout"):
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}={value} must be a positive number of seconds.")
    if config.keep_alive_max_attempt < 1:
        raise ConfigError(
            f"--keep-alive-max-attempt={config.keep_alive_max_attempt} must be at least 1: the heartbeats a "
            "node may miss before its peers drop it."
        )
    if not 1 <= config.max_nonfinite_steps <= MAX_NON_FINITE_STEPS:
        raise ConfigError(
            f"{contract.ENV_MAX_NONFINITE_STEPS}={config.max_nonfinite_steps} (spec.maxNonFiniteSteps) must "
            f"lie between 1 and {MAX_NON_FINITE_STEPS}: the consecutive skipped steps that stop a job."
        )
    if config.slowdown < 1:
        raise ConfigError(f"--slowdown={config.slowdown} must be at least 1.")
    for flag, seconds in (
        ("--simulated-vnode-seconds", config.simulated_vnode_seconds),
        ("--simulated-sync-seconds", config.simulated_sync_seconds),
    ):
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ConfigError(f"{flag}={seconds} must be a number of seconds, 0 (the default) or more.")


def _check_processes(config: TrainerConfig) -> None:
    """Every training process of the largest world needs a virtual node: V >= max replicas x N."""
    n = config.nproc_per_node
    if n < 1:
        raise ConfigError(f"--nproc-per-node={n} must be at least 1.")
    if config.backend not in BACKENDS:
        raise ConfigError(f"--backend={config.backend!r} must be one of {BACKENDS}.")
    processes = config.max_replicas * n
    if config.virtual_nodes < processes:
        raise ConfigError(
            f"{contract.ENV_VIRTUAL_NODES}={config.virtual_nodes} (spec.virtualNodes) is below "
            f"{contract.ENV_MAX_REPLICAS}={config.max_replicas} x --nproc-per-node={n} = {processes} "
            "training processes: every process needs a virtual node. Raise spec.virtualNodes to at least "
            f"{processes} (a divisor of spec.globalBatchSize), or lower spec.replicas.max or "
            "--nproc-per-node."
        )


def check_devices(config: TrainerConfig, gpus: int) -> None:
    """With CUDA each process takes one GPU (cuda:LOCAL_RANK); nccl needs them."""
    if config.backend == "nccl" and gpus == 0:
        raise ConfigError("--backend=nccl needs CUDA GPUs, and none is visible: use --backend gloo or auto.")
    if gpus and config.nproc_per_node > gpus:
        raise ConfigError(
            f"--nproc-per-node={config.nproc_per_node} exceeds the {gpus} GPUs visible to this container: "
            "each process uses one GPU; lower it or raise the worker's nvidia.com/gpu limit."
        )


def _shape_values(config: TrainerConfig) -> dict[str, object]:
    """The spec fields the trainer receives, by their spec path (an unset field left out)."""
    values: dict[str, object] = {
        "replicas.min": config.min_replicas,
        "replicas.max": config.max_replicas,
        "virtualNodes": config.virtual_nodes,
        "globalBatchSize": config.global_batch_size,
        "batching": config.batching,
        "lrScaling": config.lr_scaling,
    }
    if config.max_global_batch_size is not None:
        values["maxGlobalBatchSize"] = config.max_global_batch_size
    if config.momentum_correction:
        values["momentumCorrection"] = True
    return values


def _shape(values: dict[str, object]) -> TrainingShape:
    shape = {
        "replicas": {"min": values["replicas.min"], "max": values["replicas.max"]},
        **{path: value for path, value in values.items() if not path.startswith("replicas.")},
    }
    return TrainingShape.model_validate(shape)


def _check_shape(config: TrainerConfig) -> None:
    """V, B, min/max, batching, LR scaling and the largest B, by the API's own bounds and rules."""
    values = _shape_values(config)
    try:
        model = _shape(values)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise ConfigError(
            f"{SHAPE_VARIABLES.get(path, path)}={values.get(path)!r} (spec.{path}): {first['msg']}"
        ) from None
    for _, rule in rule_violations(model):
        named = [f"{SHAPE_VARIABLES[p]}={values[p]}" for p in values if f"spec.{p}" in rule.message]
        raise ConfigError(f"{', '.join(named)}: {rule.message}")


def _check_band_limit(config: TrainerConfig) -> None:
    """spec.bandLimit's maxCompressionRate by the API's own bounds."""
    try:
        BandLimit(maxCompressionRate=config.max_compression_rate)
    except ValidationError as error:
        raise ConfigError(
            f"{contract.ENV_MAX_COMPRESSION_RATE}={config.max_compression_rate!r} "
            f"(spec.bandLimit.maxCompressionRate): {error.errors()[0]['msg']}"
        ) from None


def batch_violation(config: TrainerConfig, batch: int) -> str | None:
    """Why ``batch`` cannot be this job's global batch (None when it can): it must lie between
    spec.globalBatchSize and spec.maxGlobalBatchSize and obey the spec's rules for a global batch."""
    largest = config.max_global_batch_size
    if largest is None:
        return "spec.maxGlobalBatchSize is unset, so the global batch stays spec.globalBatchSize"
    if not config.global_batch_size <= batch <= largest:
        return (
            f"outside [spec.globalBatchSize, spec.maxGlobalBatchSize] = [{config.global_batch_size}, "
            f"{largest}]"
        )
    try:
        model = _shape({**_shape_values(config), "globalBatchSize": batch})
    except ValidationError as error:
        return str(error.errors()[0]["msg"])
    broken = [rule.message for _, rule in rule_violations(model)]
    return f"a global batch must obey the spec's rule: {broken[0]}" if broken else None
