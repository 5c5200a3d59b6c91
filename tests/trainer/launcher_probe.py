"""`ebbflow-train`, then a list of the threads still alive when it returned (JSON, last line of stdout).

A thread left running into interpreter exit while inside a C++ call aborts the process (exit 134)
after a successful run; the launcher must stop every thread it started before it returns.
"""

from __future__ import annotations

import json
import sys
import threading

from ebbflow_trainer.__main__ import main

if __name__ == "__main__":  # the forkserver imports this module again in every worker
    code = main(sys.argv[1:])
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    print("threads alive at exit: " + json.dumps(alive), flush=True)
    sys.exit(code)
