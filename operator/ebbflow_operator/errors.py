"""The operator's own error for a failed Kubernetes API call.

The I/O layer (kube.py) converts the client library's exceptions into `KubeError` where it makes
the call, so the code above it (the reconcile loop, tests and their fakes) never imports the
Kubernetes client to handle a failed write. No imports: anything may depend on this module.
"""

from __future__ import annotations


class KubeError(Exception):
    """An API call the server answered with a non-2xx status (or that never got an answer: 0)."""

    def __init__(self, status: int, reason: str = "", body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:512]}")
        self.status = status
        self.reason = reason
        self.body = body
