"""Reads from a cluster's API server in this process: one pooled HTTPS connection, no kubectl process
per read. The e2e tier and the demo poll the cluster every few seconds for minutes; through kubectl
each poll started a Go binary and a TLS handshake, and the e2e tier's waiting process used about a
quarter of CI's two cores (docs/ci.md). Writes stay with kubectl.

Invariants: an answer is the API server's JSON, the objects `kubectl get -o json` prints; a status
other than 2xx raises KindError naming the path and the status (404 too: the caller decides what
absence means); a certificate or key the kubeconfig embeds is written to a private directory
removed with the reader.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
import yaml

from ebbflow_devtools.errors import KindError

READ_TIMEOUT_S = 30.0


class ApiReader:
    """GETs against the API server of the kubeconfig's current context, as its user (a client
    certificate or a bearer token)."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        context = _named(config["contexts"], config["current-context"])["context"]
        cluster = _named(config["clusters"], context["cluster"])["cluster"]
        user = _named(config["users"], context["user"])["user"]
        self._secrets = tempfile.TemporaryDirectory(prefix="ebbflow-api-")
        self.server = cluster["server"].rstrip("/")
        self._headers = {"Authorization": f"Bearer {user['token']}"} if "token" in user else {}
        self._pool = urllib3.PoolManager(
            maxsize=2,
            ca_certs=self._file(cluster, "certificate-authority"),
            cert_file=self._file(user, "client-certificate"),
            key_file=self._file(user, "client-key"),
            timeout=urllib3.Timeout(total=READ_TIMEOUT_S),
            retries=False,
        )

    def _file(self, entry: dict[str, Any], key: str) -> str | None:
        """The path of the kubeconfig's `key` (a file it names, or its `key`-data written out)."""
        if f"{key}-data" in entry:
            path = Path(self._secrets.name) / key
            path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
            path.chmod(0o600)
            return str(path)
        return str(entry[key]) if key in entry else None

    def close(self) -> None:
        self._pool.clear()
        self._secrets.cleanup()

    def text(self, path: str, **query: str) -> str:
        """The body of GET `path` (with `query`), decoded."""
        url = f"{self.server}{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            answer = self._pool.request("GET", url, headers=self._headers)
        except urllib3.exceptions.HTTPError as error:
            raise KindError(f"GET {path}: {error}") from error
        body = answer.data.decode(errors="replace")
        if not 200 <= answer.status < 300:
            raise KindError(f"GET {path}: HTTP {answer.status}: {body[:500]}")
        return body

    def json(self, path: str, **query: str) -> Any:
        return json.loads(self.text(path, **query))

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of `namespace` matching the label `selector`, as `kubectl get pods -l` lists them."""
        return list(self.json(f"/api/v1/namespaces/{quote(namespace)}/pods", labelSelector=selector)["items"])

    def custom_object(self, group_version: str, namespace: str, plural: str, name: str) -> dict[str, Any]:
        path = f"/apis/{group_version}/namespaces/{quote(namespace)}/{plural}/{quote(name)}"
        return dict(self.json(path))

    def log(self, namespace: str, pod: str) -> str:
        """The pod's (only) container's log, whole, as `kubectl logs` prints it."""
        return self.text(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log")


def _named(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for entry in entries:
        if entry["name"] == name:
            return entry
    raise KindError(f"the kubeconfig has no entry named {name!r}")
