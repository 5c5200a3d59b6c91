"""ebbflow_trainer.launch.warm_forkserver: the workers' forkserver is forked from the launcher (no second
interpreter, nothing imported twice), serves workers as multiprocessing's own does, and is started
the usual way when the launcher already runs other threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys, threading
    from multiprocessing import forkserver
    from ebbflow_trainer.launch import warm_forkserver

    def report(connection):
        connection.send((os.getppid(), "json" in sys.modules))

    if __name__ == "__main__":
        if sys.argv[1] == "busy":
            threading.Thread(target=threading.Event().wait, daemon=True).start()
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["json"])
        forked = warm_forkserver.start()
        server = forkserver._forkserver
        server.ensure_running()
        mine = open("/proc/self/cmdline", "rb").read()
        theirs = open(f"/proc/{server._forkserver_pid}/cmdline", "rb").read()
        receive, send = context.Pipe(duplex=False)
        worker = context.Process(target=report, args=(send,))
        worker.start()
        parent, preloaded = receive.recv()
        worker.join()
        print(forked, theirs == mine, parent == server._forkserver_pid, preloaded, worker.exitcode)
    """
)


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [
        pytest.param("calm", "True True True True 0", id="one-thread-forks-it"),
        pytest.param("busy", "False False True True 0", id="other-threads-spawn-it"),
    ],
)
def test_the_forkserver_is_forked_from_a_single_threaded_launcher(
    tmp_path: Path, launcher: str, expected: str
) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), launcher], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == expected, result.stderr
