"""A warm parent for the trainer tier's `ebbflow-train` processes (launchers and rendezvous stores).

It imports torch, torch._dynamo, torch elastic and scikit-learn's digits once (about 7 s of CPU per
process otherwise), then forks each process on request: the child takes its own session,
environment, working directory and log and runs `ebbflow_trainer.__main__.main` with its arguments,
as the exec'd command would. Children are real processes (signals, process groups, their own
forkservers and workers, real rendezvous); the exec'd path stays covered wherever the tier names
another launcher, by the images' smoke test and by the e2e tier.

Protocol: JSON lines. Requests on stdin: {"argv": [...], "env": {...}, "cwd": "...", "log": "..."};
replies on stdout: {"pid": N} for each request in order, {"exited": N, "code": C} when a child ends
(C as `subprocess.Popen.returncode`: negative for a signal). EOF on stdin ends the zygote.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import traceback
from typing import Any

WARM_IMPORTS = (
    "torch",
    "torch._dynamo",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing",
    "sklearn.datasets",
    "ebbflow_trainer.__main__",
    "ebbflow_trainer.launch.agent",
    "ebbflow_trainer.launch.launcher",
    "ebbflow_trainer.launch.rendezvous",
    "ebbflow_trainer.launch.worker",
)


def _run_child(request: dict[str, Any]) -> int:
    """In the forked child: become the requested `ebbflow-train` process; its exit status."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from ebbflow_trainer import __main__ as entry

    sys.modules["__main__"] = entry
    sys.argv = [entry.__file__, *request["argv"]]
    try:
        return int(entry.main(request["argv"]))
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def _reap(out: Any) -> None:
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        out.write(json.dumps({"exited": pid, "code": _status(wait_status)}) + "\n")


def serve() -> None:
    """Answer requests until stdin closes; report every child's end."""
    for module in WARM_IMPORTS:
        __import__(module)
    out = sys.stdout
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_read:
                os.read(wake_read, 4096)
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                out.flush()  # nothing of ours may sit in a buffer the child inherits
                pid = os.fork()
                if pid == 0:
                    os._exit(_run_child(json.loads(line)))
                out.write(json.dumps({"pid": pid}) + "\n")
        _reap(out)
        out.flush()


if __name__ == "__main__":
    serve()
