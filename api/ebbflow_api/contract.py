"""The contract between the Ebbflow operator and the trainer: the one place every shared key lives.

The operator imports these names to build worker pods; the trainer imports them to read its
environment. Pure Python with no third-party imports, so the operator never pulls in torch.
Never spell one of these strings anywhere else.
"""

from __future__ import annotations

from typing import Final

# --- The custom resource -------------------------------------------------------------------------
API_GROUP: Final = "ebbflow.dev"
API_VERSION: Final = "v1alpha1"
KIND: Final = "ElasticTrainingJob"
PLURAL: Final = "elastictrainingjobs"
SHORT_NAME: Final = "etj"

# --- Labels and annotations on the pods and Services the operator creates -------------------------
LABEL_JOB_NAME: Final = f"{API_GROUP}/job-name"
LABEL_ROLE: Final = f"{API_GROUP}/role"
ROLE_WORKER: Final = "worker"
ROLE_RENDEZVOUS: Final = "rendezvous"
LABEL_WORKER_INDEX: Final = f"{API_GROUP}/worker-index"
ANNOTATION_WORLD_GENERATION: Final = f"{API_GROUP}/world-generation"
# The global batch B the policy chose for a job with spec.maxGlobalBatchSize (see ENV_GLOBAL_BATCH_SIZE_FILE).
ANNOTATION_GLOBAL_BATCH_SIZE: Final = f"{API_GROUP}/global-batch-size"
# The GPU memory (MiB, a decimal integer) each worker of a job with spec.bandLimit may use: the
# smallest over its workers (see ENV_MEMORY_BUDGET_FILE).
ANNOTATION_MEMORY_BUDGET: Final = f"{API_GROUP}/memory-budget-mib"
# Rank 0 writes a JSON progress report here on its own pod (see PROGRESS_FIELDS); the operator
# copies the newest report into the job's status.progress. "eval" is the training script's last
# evaluation, {"step": int, "metrics": {name: number}}, or null. The step's shape and time split
# feed the goodput and quality policies (the operator keeps a short history of them): worldSize
# workers, each doing accumulationSteps + 1 micro-batches of microBatch samples; stepSeconds =
# accumulationSteps + 1 micro-batches of computeSeconds each (rank 0's forward+backward), plus
# communicationSeconds (the rest: gradient sync and waiting for slower workers). noiseScale is the
# gradient noise scale (null unless the trainer estimates it); rescalePauseSeconds the last pause
# of a membership change (null before any); compressionRate the band-limited convolutions' rate in
# use (null unless spec.bandLimit).
ANNOTATION_PROGRESS: Final = f"{API_GROUP}/progress"
PROGRESS_FIELDS: Final = (
    "step",
    "samples",
    "loss",
    "samplesPerSecond",
    "time",
    "eval",
    "worldSize",
    "microBatch",
    "accumulationSteps",
    "stepSeconds",
    "computeSeconds",
    "communicationSeconds",
    "noiseScale",
    "rescalePauseSeconds",
    "compressionRate",
)

# --- Environment variables the operator sets on every worker container ---------------------------
ENV_JOB_NAME: Final = "EBBFLOW_JOB_NAME"
ENV_NAMESPACE: Final = "EBBFLOW_NAMESPACE"
ENV_POD_NAME: Final = "EBBFLOW_POD_NAME"
# host:port of the job's rendezvous pod by its DNS name under the job's headless Service (never a
# worker pod; a replaced store answers to the same name).
ENV_RDZV_ENDPOINT: Final = "EBBFLOW_RDZV_ENDPOINT"
# Unique per job incarnation, so a recreated job with the same name never joins an old round.
ENV_RDZV_ID: Final = "EBBFLOW_RDZV_ID"
ENV_MIN_REPLICAS: Final = "EBBFLOW_MIN_REPLICAS"
ENV_MAX_REPLICAS: Final = "EBBFLOW_MAX_REPLICAS"
ENV_VIRTUAL_NODES: Final = "EBBFLOW_VIRTUAL_NODES"
ENV_GLOBAL_BATCH_SIZE: Final = "EBBFLOW_GLOBAL_BATCH_SIZE"
ENV_BATCHING: Final = "EBBFLOW_BATCHING"
# spec.maxGlobalBatchSize (unset: absent). Only then may B change during the run: the operator
# writes the B its goodput policy chose to ANNOTATION_GLOBAL_BATCH_SIZE on every worker pod, the
# kubelet projects it (downward API volume) into the file at ENV_GLOBAL_BATCH_SIZE_FILE, and the
# trainers switch to it together at a step boundary (rank 0 reads the file; the choice travels in
# the step's collective). An empty or missing file, or a value the spec does not allow, keeps B.
ENV_MAX_GLOBAL_BATCH_SIZE: Final = "EBBFLOW_MAX_GLOBAL_BATCH_SIZE"
ENV_GLOBAL_BATCH_SIZE_FILE: Final = "EBBFLOW_GLOBAL_BATCH_SIZE_FILE"
ENV_LR_SCALING: Final = "EBBFLOW_LR_SCALING"
# spec.momentumCorrection: "true" when set (absent otherwise).
ENV_MOMENTUM_CORRECTION: Final = "EBBFLOW_MOMENTUM_CORRECTION"
# spec.bandLimit (absent otherwise): ENV_BAND_LIMIT is "true" and ENV_MAX_COMPRESSION_RATE its
# maxCompressionRate. The operator writes the per-worker GPU memory budget to
# ANNOTATION_MEMORY_BUDGET on every worker pod, the kubelet projects it into the file at
# ENV_MEMORY_BUDGET_FILE, and the trainers switch together, at a step boundary, to the smallest
# compression rate whose measured peak fits it (rank 0 reads the file; the choice travels in the
# step's collective). An empty or missing file keeps the rate in use.
ENV_BAND_LIMIT: Final = "EBBFLOW_BAND_LIMIT"
ENV_MAX_COMPRESSION_RATE: Final = "EBBFLOW_MAX_COMPRESSION_RATE"
ENV_MEMORY_BUDGET_FILE: Final = "EBBFLOW_MEMORY_BUDGET_FILE"
ENV_WORLD_GENERATION: Final = "EBBFLOW_WORLD_GENERATION"
ENV_CHECKPOINT_PATH: Final = "EBBFLOW_CHECKPOINT_PATH"
ENV_CHECKPOINT_INTERVAL_STEPS: Final = "EBBFLOW_CHECKPOINT_INTERVAL_STEPS"
# A checkpoint path `s3://bucket/prefix` (spec.checkpoint): the store's endpoint, how many complete
# checkpoints it keeps, and its credentials as the standard AWS variables (AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, from the Secret spec.checkpoint.credentialsSecret names; AWS_REGION
# optional, us-east-1 when unset).
ENV_CHECKPOINT_ENDPOINT: Final = "EBBFLOW_CHECKPOINT_ENDPOINT"
ENV_CHECKPOINT_RETAIN: Final = "EBBFLOW_CHECKPOINT_RETAIN"
DEFAULT_CHECKPOINT_RETAIN: Final = 2
ENV_METRICS_PORT: Final = "EBBFLOW_METRICS_PORT"
# Seconds a worker has between SIGTERM and SIGKILL; the trainer finishes its step and hands its
# state over within it. The operator sets the pod's terminationGracePeriodSeconds to the same value.
ENV_LEAVE_GRACE_SECONDS: Final = "EBBFLOW_LEAVE_GRACE_SECONDS"
# spec.maxNonFiniteSteps: consecutive steps with a non-finite loss or gradient (each one skipped)
# after which the trainer stops with EXIT_NONFINITE_LOSS.
ENV_MAX_NONFINITE_STEPS: Final = "EBBFLOW_MAX_NONFINITE_STEPS"
# Where the trainer writes why it stopped (the container's terminationMessagePath); the kubelet puts
# it in the pod's status.containerStatuses[].state.terminated.message, which the operator quotes.
ENV_TERMINATION_MESSAGE_PATH: Final = "EBBFLOW_TERMINATION_MESSAGE_PATH"

# spec.rendezvous: the rendezvous pod serves on ENV_RDZV_PORT; a worker waits
# ENV_RDZV_JOIN_TIMEOUT_SECONDS for a rendezvous round.
ENV_RDZV_PORT: Final = "EBBFLOW_RDZV_PORT"
ENV_RDZV_JOIN_TIMEOUT_SECONDS: Final = "EBBFLOW_RDZV_JOIN_TIMEOUT_SECONDS"
# The rendezvous pod's endpoint of deaths the operator declares (ebbflow_trainer.launch.declarations):
# it listens on ENV_DECLARATIONS_PORT when ENV_RDZV_TOKEN is set, and takes POST DECLARATIONS_PATH
# with `Authorization: Bearer <token>` and {"pods": {"<pod>": "<evidence>"}}. The token is the job's
# (RDZV_TOKEN_KEY of the Secret the operator creates beside the rendezvous pod); ENV_MIN_REPLICAS and
# ENV_MAX_REPLICAS are set there too. Each launcher publishes its node under its pod's name.
ENV_RDZV_TOKEN: Final = "EBBFLOW_RDZV_TOKEN"
ENV_DECLARATIONS_PORT: Final = "EBBFLOW_DECLARATIONS_PORT"
RDZV_TOKEN_KEY: Final = "token"
DECLARATIONS_PATH: Final = "/v1/gone"

# --- The rendezvous pod ----------------------------------------------------------------------------
# Default command of the rendezvous pod (it hosts the c10d TCPStore), followed by
# RENDEZVOUS_PORT_FLAG <port> (the port is in ENV_RDZV_PORT too); it runs the worker template's first
# image unless spec.rendezvous overrides image or command.
RENDEZVOUS_COMMAND: Final = ("ebbflow-train", "rendezvous")
RENDEZVOUS_PORT_FLAG: Final = "--port"

# --- Ports ---------------------------------------------------------------------------------------
RENDEZVOUS_PORT: Final = 29400
DECLARATIONS_PORT: Final = 29401  # 29402 when spec.rendezvous.port takes 29401
METRICS_PORT: Final = 9400

# --- Exit codes ----------------------------------------------------------------------------------
# 0 means both "training finished" and "left gracefully after SIGTERM"; the operator tells them
# apart by whether it asked the pod to leave.
EXIT_SUCCESS: Final = 0
# The trainer's configuration is invalid: retrying cannot help, so the operator fails the job.
EXIT_INVALID_CONFIG: Final = 64
# Training diverged: ENV_MAX_NONFINITE_STEPS consecutive steps had a non-finite loss or gradient.
# Restarting would replay the same divergence, so the operator fails the job.
EXIT_NONFINITE_LOSS: Final = 65
# A torchrun script (`ebbflow-train torchrun`) failed before it joined its world's process group: an
# error of its own (a bad flag, an import error), not a peer's loss, which a restart would replay.
EXIT_SCRIPT_FAILED: Final = 66
# Exit codes that no restart can cure, and the reason of the Failed condition each one leads to.
FATAL_EXIT_REASONS: Final = {
    EXIT_INVALID_CONFIG: "InvalidConfig",
    EXIT_NONFINITE_LOSS: "NonFiniteLoss",
    EXIT_SCRIPT_FAILED: "ScriptFailed",
}
# A worker asked to leave (SIGTERM) whose training processes were still running when the leave grace
# (ENV_LEAVE_GRACE_SECONDS, less the launcher's margin) ran out, and were killed: e.g. a torchrun
# script that took the stop flag (ebbflow_trainer.elastic.should_stop) and ignored it. A leave, not a
# failure: the next world resumes from the last state saved; the operator sets the job's
# LeaveTimedOut condition and a warning, quoting the termination message.
EXIT_LEAVE_TIMED_OUT: Final = 67
# A worker killed by SIGKILL (128 + 9) or SIGTERM (128 + 15), or asked to leave and killed past its
# grace: preemption, not failure.
EXIT_SIGKILL: Final = 137
EXIT_SIGTERM: Final = 143
PREEMPTION_EXIT_CODES: Final = frozenset({EXIT_SIGKILL, EXIT_SIGTERM, EXIT_LEAVE_TIMED_OUT})

DEFAULT_LEAVE_GRACE_SECONDS: Final = 60

# --- Lines the trainer logs that the demo and the e2e tier read back -------------------------------
# Each: the `logging` format the trainer renders and the pattern that parses the rendered line
# (ebbflow_devtools.trainer_logs; a unit test renders every format and parses it back).
# Every worker of a new world: where it resumed; rank 0 adds ", N step(s) lost".
RESUMES_LOG: Final = "generation %s: rank %s of %s resumes at step %s from %s%s"
RESUMES_PATTERN: Final = (
    r"generation (\d+): rank (\d+) of (\d+) resumes at step (\d+) from (\w+)(?:, (\d+) step\(s\) lost)?"
)
# Rank 0, after a new world's first step: the pause since the previous world's last step.
RESUMED_LOG: Final = "generation %s: training resumed after a %.2f s pause"
RESUMED_PATTERN: Final = r"generation (\d+): training resumed after a ([\d.]+) s pause"
# Rank 0, at the end: the step and a digest of the model.
FINISHED_LOG: Final = "finished at step %s; model sha256 %s"
FINISHED_PATTERN: Final = r"finished at step (\d+); model sha256 ([0-9a-f]{64})"
# Every worker, when the world switches together: the global batch (maxGlobalBatchSize, the policy's
# choice) and the compression rate (bandLimit, the memory budget's), from the step named on.
BATCH_LOG: Final = "from step %s the global batch size is %s (was %s): %s samples per virtual node"
BATCH_PATTERN: Final = (
    r"from step (\d+) the global batch size is (\d+) \(was (\d+)\): (\d+) samples per virtual node"
)
RATE_LOG: Final = "from step %s the compression rate is %s (was %s)"
RATE_PATTERN: Final = r"from step (\d+) the compression rate is ([\d.]+) \(was ([\d.]+)\)"
# Rank 0's launcher, when a checkpoint in an object store is complete (its manifest written).
COMMITTED_LOG: Final = "checkpoint of step %d committed to %s in %.2f s"
COMMITTED_PATTERN: Final = r"checkpoint of step (\d+) committed to (s3://\S+) in ([\d.]+) s"
