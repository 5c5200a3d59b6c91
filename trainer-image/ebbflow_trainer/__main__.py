"""``ebbflow-train``: ``run`` (a TrainingSpec script) or ``torchrun`` (a script written for torchrun) in
every worker pod, ``rendezvous`` in the job's rendezvous pod.

Invariant: SIGTERM is handled from the first statement of `main` on. A pod whose ``command:`` names
``ebbflow-train`` (every example's does; it replaces the image's tini entrypoint) runs it as PID 1, and
the kernel discards a signal PID 1 has no handler for: a pod deleted while its launcher starts would
otherwise join, train and be killed when its grace period ran out. Until the launcher or the store
takes the signal over, SIGTERM means: nothing joined yet, exit 0 at once (`STOPPED_BEFORE_JOINING`).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
from typing import TYPE_CHECKING

from ebbflow_api import contract

if TYPE_CHECKING:
    from types import FrameType

    from ebbflow_trainer.config import TrainerConfig

STOPPED_BEFORE_JOINING = (
    "ebbflow-train: asked to stop (SIGTERM) before joining the job: nothing to hand over, leaving"
)


class _StoppedBeforeJoining(BaseException):
    """SIGTERM before the launcher or the store took it over. A BaseException, so that no ``except
    Exception`` on the way (a training script's import, for one) swallows it."""


def _stop_before_joining(entry_pid: int, signum: int, frame: FrameType | None) -> None:
    if os.getpid() != entry_pid:  # a process forked before the launcher took the signal over
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise _StoppedBeforeJoining


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ebbflow-train", description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    rdzv = commands.add_parser("rendezvous", help="serve the job's rendezvous store (the rendezvous pod)")
    rdzv.add_argument("--host", default="0.0.0.0")
    # The operator runs contract.RENDEZVOUS_COMMAND followed by RENDEZVOUS_PORT_FLAG <port>.
    rdzv.add_argument(contract.RENDEZVOUS_PORT_FLAG, dest="port", type=int, default=contract.RENDEZVOUS_PORT)
    rdzv.add_argument("--port-file", help="write the port here once serving (useful with --port 0)")

    run = commands.add_parser(
        "run",
        help="train in this worker pod (settings from the contract's EBBFLOW_* environment)",
    )
    run.add_argument("spec", help="training script: path/to/train.py[:build] or package.module[:build]")
    run.add_argument("--mode", default="deterministic", help="deterministic (bitwise) or fast (all-reduce)")
    run.add_argument(
        "--backend",
        default="auto",
        help="collective backend: auto (nccl with CUDA, else gloo), nccl or gloo",
    )
    run.add_argument(
        "--row-table-limit",
        type=int,
        default=argparse.SUPPRESS,  # TrainerConfig's default (2 MiB)
        help="deterministic mode: bytes of V rows up to which one row per virtual node is all-reduced "
        "(faster for small models; default 2 MiB); exact sums above, always with 0",
    )
    run.add_argument(
        "--bucket-mb",
        type=float,
        default=argparse.SUPPRESS,  # TrainerConfig's default (25, as DDP's bucket_cap_mb)
        help="fast mode: MiB of gradients all-reduced together while backward runs (default 25)",
    )
    run.add_argument(
        "--steps", type=int, help="global steps to train (default: the script's TrainingSpec.steps)"
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--base-batch-size", type=int, help="batch the learning rate was tuned for (LR scaling)")
    run.add_argument("--journal", default="", help="append a JSON-lines record of generations and steps here")
    _add_launch_flags(run)
    run.add_argument("--dead-band", type=float, default=0.2, help="dynamic batching: smallest change applied")
    run.add_argument("--progress-interval", type=float, default=5.0, dest="progress_interval_seconds")
    run.add_argument(
        "--simulated-vnode-seconds", type=float, default=0.0, help="model device time (CPU tests)"
    )
    run.add_argument(
        "--simulated-sync-seconds",
        type=float,
        default=0.0,
        help="model a slow interconnect: seconds each step of a multi-worker world spends in its collective "
        "(tests, benchmarks)",
    )
    run.add_argument("--slowdown", type=float, default=1.0, help="model a slower device (tests, benchmarks)")

    torchrun = commands.add_parser(
        "torchrun",
        help="run a script written for torchrun (it reads RANK, WORLD_SIZE, ... and calls "
        "init_process_group) as an elastic job; every world change restarts it, as torchrun does",
    )
    _add_launch_flags(torchrun)
    torchrun.add_argument("spec", metavar="SCRIPT", help="the training script, path/to/train.py")
    torchrun.add_argument(
        "script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="the script's arguments"
    )
    return parser


def _add_launch_flags(command: argparse.ArgumentParser) -> None:
    """What ``run`` and ``torchrun`` share: the processes per pod, the handoff directory, the address
    and the rendezvous, store and collective timeouts."""
    command.add_argument(
        "--nproc-per-node",
        type=int,
        help="training processes in this pod, one per GPU (default: the GPUs visible, else 1); "
        "every pod of a job must run the same number",
    )
    command.add_argument(
        "--state-dir", help="node-local handoff directory (default /dev/shm/ebbflow/<rdzv id>)"
    )
    command.add_argument(
        "--node-addr", default="", help="address other nodes know this node by (default: hostname)"
    )
    _add_timeouts(command)
    command.add_argument("--monitor-interval", type=float, default=0.2)


def _add_timeouts(run: argparse.ArgumentParser) -> None:
    """``run``'s rendezvous, store and collective timeouts."""
    run.add_argument(
        "--join-timeout",
        type=float,
        help=f"default ${contract.ENV_RDZV_JOIN_TIMEOUT_SECONDS} (spec.rendezvous.joinTimeoutSeconds)",
    )
    run.add_argument(
        "--last-call-timeout",
        type=float,
        default=1.0,
        help="wait for more nodes once min have joined",
    )
    run.add_argument(
        "--keep-alive-interval",
        type=float,
        default=argparse.SUPPRESS,  # TrainerConfig's default (1 s)
        help="rendezvous heartbeat period (s)",
    )
    run.add_argument(
        "--keep-alive-max-attempt",
        type=int,
        default=argparse.SUPPRESS,  # TrainerConfig's default (10)
        help="missed heartbeats before a node is dead",
    )
    run.add_argument("--store-timeout", type=float, default=60.0)
    run.add_argument(
        "--store-loss-timeout",
        type=float,
        default=300.0,
        help="how long to wait for a new rendezvous store at the same address after losing it (s); "
        "the world trains on meanwhile and re-forms once it answers",
    )
    run.add_argument("--collective-timeout", type=float, default=60.0)


def main(argv: list[str] | None = None) -> int:
    previous = signal.signal(signal.SIGTERM, functools.partial(_stop_before_joining, os.getpid()))
    try:
        return _command(argv)
    except _StoppedBeforeJoining:
        print(STOPPED_BEFORE_JOINING, file=sys.stderr, flush=True)
        sys.stdout.flush()
        # At once: a thread or forkserver started before the signal has nothing to finish.
        os._exit(contract.EXIT_SUCCESS)
    finally:
        signal.signal(signal.SIGTERM, previous)  # for a caller in the same process (tests)


def _command(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "rendezvous":
        from ebbflow_trainer.launch.rendezvous import serve

        return serve(args.host, args.port, args.port_file)

    from ebbflow_trainer.config import ConfigError, from_environment
    from ebbflow_trainer.termination import write_termination_message

    flags = vars(args).copy()
    torchrun = flags.pop("command") == "torchrun"
    if torchrun:
        flags["script_args"] = tuple(flags["script_args"])
    try:
        config = from_environment(os.environ, **flags)
        _check_checkpoint_path(config)
        if torchrun:
            _check_script(config)
        else:
            _check_spec(config)
    except ConfigError as error:
        why = f"invalid configuration: {error}"
        print(f"ebbflow-train: {why}", file=sys.stderr)
        write_termination_message(os.environ.get(contract.ENV_TERMINATION_MESSAGE_PATH, ""), why)
        return contract.EXIT_INVALID_CONFIG

    from ebbflow_trainer.launch.launcher import run as launch

    return launch(config, torchrun=torchrun)


def _check_checkpoint_path(config: TrainerConfig) -> None:
    """Rank 0 writes checkpoints there: a path it cannot write would fail it at its first checkpoint
    while the other workers wait out the join timeout, so every worker checks before joining."""
    import tempfile
    from pathlib import Path

    from ebbflow_trainer.config import ConfigError

    if not config.checkpoint_path:
        return
    if config.checkpoint_path.startswith("s3://"):
        _check_object_store(config)
        return
    path = Path(config.checkpoint_path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ebbflow-write-check-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"{contract.ENV_CHECKPOINT_PATH}={path} (spec.checkpoint.path) is not writable "
            f"({error.strerror or error}): mount a writable volume there (a ReadWriteMany "
            "PersistentVolumeClaim on a real cluster, an emptyDir to try it) or change spec.checkpoint.path."
        ) from None


def _check_object_store(config: TrainerConfig) -> None:
    """The bucket must exist and the credentials work before any node joins (a refusal at the first
    checkpoint would lose the steps before it)."""
    from ebbflow_trainer.config import ConfigError
    from ebbflow_trainer.launch.object_checkpoints import ObjectStoreError, from_config

    try:
        checkpoints = from_config(config, os.environ)
        if checkpoints is not None:
            checkpoints.check()
    except ObjectStoreError as error:
        raise ConfigError(str(error)) from None


def _check_script(config: TrainerConfig) -> None:
    """A torchrun script must exist before any node joins a world that would only restart it."""
    from pathlib import Path

    from ebbflow_trainer.config import ConfigError

    if not Path(config.spec).is_file():
        raise ConfigError(
            f"training script {config.spec!r} is not a file in this container: give the path of the script "
            "in the worker image or in a mounted volume (a ConfigMap, for one)."
        )


def _check_spec(config: TrainerConfig) -> None:
    """Load the training script once before joining, so a broken script fails the job instead of looping."""
    import torch

    from ebbflow_trainer.api import SpecError, load_spec
    from ebbflow_trainer.config import ConfigError
    from ebbflow_trainer.lr_scaling import momentum_correction_problem
    from ebbflow_trainer.step.selection import sharding_problem

    try:
        spec = load_spec(config.spec)
    except (ImportError, AttributeError, TypeError, FileNotFoundError, SpecError) as error:
        raise ConfigError(f"training script {config.spec!r}: {error}") from None
    if len(spec.dataset) < config.global_batch_size:
        raise ConfigError(
            f"{contract.ENV_GLOBAL_BATCH_SIZE}={config.global_batch_size} exceeds the {len(spec.dataset)} "
            "samples of the dataset: lower the global batch size or provide more data."
        )
    problem = momentum_correction_problem(spec.optimizer) if config.momentum_correction else None
    if problem:
        raise ConfigError(
            f"{contract.ENV_MOMENTUM_CORRECTION}=true (spec.momentumCorrection), but {problem}: use "
            "torch.optim.SGD with momentum in the training script or leave momentumCorrection unset."
        )
    if config.band_limit and not any(isinstance(m, torch.nn.Conv2d) for m in spec.model.modules()):
        raise ConfigError(
            f"{contract.ENV_BAND_LIMIT}=true (spec.bandLimit), but the training script's model has no "
            "torch.nn.Conv2d layer to band-limit: leave bandLimit unset for this model."
        )
    why = sharding_problem(spec, config)
    if why:
        raise ConfigError(f'TrainingSpec.sharding="{spec.sharding}": {why}.')
    largest = config.max_global_batch_size
    if largest is not None and len(spec.dataset) < largest:
        raise ConfigError(
            f"{contract.ENV_MAX_GLOBAL_BATCH_SIZE}={largest} exceeds the {len(spec.dataset)} samples of "
            "the dataset: lower spec.maxGlobalBatchSize or provide more data."
        )


if __name__ == "__main__":
    sys.exit(main())
