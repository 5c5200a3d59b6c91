"""The operator's side of declared deaths: each job's rendezvous token, and the HTTP call that hands
the rendezvous pod a plan's `DeclareGone` (the trainer's ``ebbflow_trainer.launch.declarations``).

A job's token is HMAC-SHA256 of the job's uid under the operator's key (the chart keeps the key in
a Secret of the operator's namespace), so the operator never reads a Secret back: it creates the
job's token Secret (its content is the same on every pass, so AlreadyExists is success) and signs
each declaration with the same token.

Invariants: a failed call raises `DeclarationError` only (the reconciler logs it; the survivors'
heartbeats still remove a dead node); a call takes at most `TIMEOUT_S`; the token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Protocol

from ebbflow_api import contract

from .decision.model import Json

TIMEOUT_S = 2.0
KEY_BYTES = 32


class DeclarationError(Exception):
    """The rendezvous pod did not take a declaration (unreachable, refused, or an old trainer)."""


def job_token(key: bytes, job_uid: str) -> str:
    """The job's rendezvous token: the same for every operator holding `key`."""
    return hmac.new(key, job_uid.encode(), hashlib.sha256).hexdigest()


def random_key() -> bytes:
    """A key for an operator started without one (tokens then change when it restarts)."""
    return secrets.token_bytes(KEY_BYTES)


def with_token(secret: Json, token: str) -> Json:
    """The job's token Secret (`manifests.rendezvous_token_secret`) with its token in."""
    return {**secret, "stringData": {contract.RDZV_TOKEN_KEY: token}}


class Declarer(Protocol):
    def declare(self, address: str, token: str, pods: Sequence[tuple[str, str]]) -> dict[str, str]:
        """POST the pods (name, evidence) to the endpoint at `address`; what became of each."""
        ...


class HttpDeclarer:
    def declare(self, address: str, token: str, pods: Sequence[tuple[str, str]]) -> dict[str, str]:
        body = json.dumps({"pods": dict(pods)}).encode()
        request = urllib.request.Request(
            f"http://{address}{contract.DECLARATIONS_PATH}",
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                outcome: dict[str, str] = json.loads(answer.read())
                return outcome
        except urllib.error.HTTPError as refused:
            raise DeclarationError(f"{address} answered {refused.code}: {refused.read()[:200]!r}") from None
        except (OSError, ValueError) as error:  # unreachable, timed out, or not JSON
            raise DeclarationError(f"{address}: {error}") from None
