"""A real, local Kubernetes control plane for tests, benchmarks and the demo.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler + the KWOK controller, each a
child process on free loopback ports, sharing one temporary folder. Nodes are fake (KWOK), the
API machinery is not: scheduling, garbage collection, taint eviction and the Eviction API all run
the real Kubernetes code. Children die with their parent (PR_SET_PDEATHSIG), so an interrupted test
run leaves no process behind. `ControlPlane.apiserver_down()` stages an API server outage.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from ebbflow_devtools.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOOLS_BIN = Path(os.environ.get("EBBFLOW_TOOLS_BIN", REPO_ROOT / ".tools" / "bin"))
STAGES_DIR = Path(__file__).parent / "stages"
REQUIRED_TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
ADMIN_USER = "ebbflow-admin"
NODE_LEASE_SECONDS = 40  # a kubelet's default
MAX_NODE_LEASE_SECONDS = 3600  # a dead fake node is noticed within the hour
NODE_MONITOR_GRACE_SECONDS = 180  # long: see _controller_manager_args


def node_monitor_grace(node_lease_seconds: int) -> int:
    """The node-monitor grace period for fake nodes with this Lease duration: at least the whole
    duration, so that a renewal (every quarter of it) may lag three quarters behind on a loaded
    machine. At 5,000 nodes with 400 s Leases and a 180 s grace, renewals lagged past it: the
    controller marked 4,000 running pods unready, and KWOK never makes them ready again."""
    return max(NODE_MONITOR_GRACE_SECONDS, node_lease_seconds)


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message says which component and shows its log."""


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str] = field(default_factory=list)  # what started it, to start it again

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class ControlPlane:
    """A running control plane. `kubeconfig` is an admin kubeconfig for it."""

    workdir: Path
    kubeconfig: Path
    server: str
    token: str
    components: list[Component] = field(default_factory=list)
    remove_workdir: bool = True

    def stop(self) -> None:
        """Stops every component (newest first) and removes the temporary folder. Idempotent."""
        for component in reversed(self.components):
            _terminate(component.process)
        self.components.clear()
        if self.remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def check_alive(self) -> None:
        for component in self.components:
            if component.process.poll() is not None:
                raise ControlPlaneError(
                    f"{component.name} exited with {component.process.returncode}:\n{component.log_tail()}"
                )

    @contextlib.contextmanager
    def apiserver_down(self, timeout: float = 180.0, await_controllers: bool = True) -> Iterator[None]:
        """Context manager: an API server outage (as in a control-plane upgrade) for the duration of
        the block. On exit, whatever happened inside, the API server is back and ready and, unless
        `await_controllers` is False (the caller then calls `await_controllers` itself), so are the
        controllers and KWOK: the plane is as usable as before for the tests that share it."""
        self.stop_apiserver()
        try:
            yield
        finally:
            self.start_apiserver(timeout)
            if await_controllers:
                self.await_controllers(timeout)

    def stop_apiserver(self) -> None:
        """Stops the kube-apiserver alone; etcd, the controllers and KWOK keep running."""
        _terminate(self._apiserver().process)

    def start_apiserver(self, timeout: float = 60.0) -> None:
        """Starts the kube-apiserver again with the same command (port, PKI, etcd); returns once it
        is ready. The controllers and KWOK reconnect by themselves, later: see `await_controllers`."""
        self.restart(self._apiserver())
        ca_cert = self.workdir / "pki" / "ca.crt"
        check = functools.partial(_api_ok, self.server, self.token, ca_cert)
        _await(self, time.monotonic() + timeout, "kube-apiserver ready again", check)

    def restart(self, old: Component) -> None:
        """Starts a stopped or exited component again with the same command, logging to the same
        file (append: the log keeps both lives)."""
        with old.log_path.open("ab") as log:
            process = _popen(old.command, log, self.workdir)
        self.components[self.components.index(old)] = Component(old.name, process, old.log_path, old.command)

    def revive(self) -> list[str]:
        """Restarts every component but the API server that has exited, as the kubelet restarts a
        control plane's static pods (the kube-scheduler exits by design when an API server restart
        leaves its cache inconsistent); returns their names."""
        exited = [c for c in self.components if c.name != "kube-apiserver" and c.process.poll() is not None]
        for component in exited:
            self.restart(component)
        return [c.name for c in exited]

    def start_component(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Component:
        """One more process run with the plane (stopped by `stop`), logging to logs/<name>.log;
        `env`: its whole environment (default: this process's)."""
        log_path = self.workdir / "logs" / f"{name}.log"
        with log_path.open("wb") as log:
            process = _popen(command, log, self.workdir, env)
        component = Component(name, process, log_path, command)
        self.components.append(component)
        return component

    def await_http(self, what: str, url: str, timeout: float) -> None:
        """Waits until `url` answers 200 (any component exiting first raises, with its log)."""
        _await(self, time.monotonic() + timeout, what, functools.partial(_http_ok, url))

    def _apiserver(self) -> Component:
        return next(c for c in self.components if c.name == "kube-apiserver")

    def await_controllers(self, timeout: float = 180.0) -> None:
        """A canary pod on a canary KWOK node gets Running: KWOK (nodes and pods), the node lifecycle
        controller (it lifts the not-ready taint) and the scheduler all watch the API again. Their
        client-go watches come back on their own, but only after a backoff of up to a minute."""
        call = functools.partial(_api_call, self.server, self.token, self.workdir / "pki" / "ca.crt")
        name = f"ebbflow-canary-{secrets.token_hex(3)}"
        label = {"ebbflow.dev/canary": name}
        capacity = {"cpu": "1", "memory": "1Gi", "pods": "10"}
        node = {
            "metadata": {"name": name, "labels": label, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        pod = {
            "metadata": {"name": name},
            "spec": {"nodeSelector": label, "containers": [{"name": "canary", "image": "canary"}]},
        }
        pod_path = f"/api/v1/namespaces/default/pods/{name}"

        def running() -> bool:
            found = call("GET", pod_path)
            if found is None:  # not created yet, or the first attempt failed: (re)create, idempotent
                call("POST", "/api/v1/nodes", node)
                call("POST", "/api/v1/namespaces/default/pods", pod)
                return False
            return bool(found.get("status", {}).get("phase") == "Running")

        try:
            what = "controllers and KWOK reconnected (a canary pod Running)"
            _await(self, time.monotonic() + timeout, what, running)
        finally:
            call("DELETE", pod_path, {"gracePeriodSeconds": 0})
            call("DELETE", f"/api/v1/nodes/{name}")


def missing_tools(tools_bin: Path = DEFAULT_TOOLS_BIN) -> list[str]:
    return [tool for tool in REQUIRED_TOOLS if not os.access(tools_bin / tool, os.X_OK)]


@contextlib.contextmanager
def running_control_plane(
    workdir: Path | None = None,
    tools_bin: Path = DEFAULT_TOOLS_BIN,
    node_lease_seconds: int = NODE_LEASE_SECONDS,
) -> Iterator[ControlPlane]:
    """Context manager: a started control plane, stopped on exit whatever happens inside."""
    plane = start_control_plane(workdir=workdir, tools_bin=tools_bin, node_lease_seconds=node_lease_seconds)
    try:
        yield plane
    finally:
        plane.stop()


@dataclass(frozen=True)
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def start_control_plane(
    workdir: Path | None = None,
    tools_bin: Path = DEFAULT_TOOLS_BIN,
    timeout: float = 60.0,
    node_lease_seconds: int = NODE_LEASE_SECONDS,
) -> ControlPlane:
    """Starts every component and waits until the API serves and the controllers run.

    `node_lease_seconds`: the fake nodes' Lease duration; KWOK renews each Lease every quarter of
    it, as a kubelet does, so thousands of fake nodes cost the API server thousands of writes a
    minute; the node-monitor grace period grows with it (`node_monitor_grace`)."""
    if not 0 < node_lease_seconds <= MAX_NODE_LEASE_SECONDS:
        raise ValueError(
            f"node_lease_seconds={node_lease_seconds}: the fake nodes' Lease duration in seconds; "
            f"pass 1 to {MAX_NODE_LEASE_SECONDS}"
        )
    missing = missing_tools(tools_bin)
    if missing:
        raise ControlPlaneError(
            f"missing tools in {tools_bin}: {', '.join(missing)}; build them with `make tools`"
        )
    remove_workdir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="ebbflow-cp-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    ports = _Ports(*free_ports(6))
    server = f"https://127.0.0.1:{ports.apiserver}"
    pki = _write_pki(root / "pki")
    kubeconfig = root / "kubeconfig"
    _write_kubeconfig(kubeconfig, server, pki.ca_cert, token)
    (root / "tokens.csv").write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    plane = ControlPlane(root, kubeconfig, server, token, remove_workdir=remove_workdir)
    try:
        _start_components(plane, tools_bin, ports, pki, time.monotonic() + timeout, node_lease_seconds)
    except BaseException:
        plane.stop()
        raise
    return plane


def _start_components(
    plane: ControlPlane, tools_bin: Path, ports: _Ports, pki: _Pki, deadline: float, node_lease_seconds: int
) -> None:
    """etcd, then the API server, then the controllers and KWOK; each awaited before what needs it."""
    root, server, token = plane.workdir, plane.server, plane.token
    start = _starter(plane, tools_bin, root / "logs")
    start("etcd", _etcd_args(root, ports))
    _await(plane, deadline, "etcd healthy", lambda: _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"))
    start("kube-apiserver", _apiserver_args(root, ports, pki))
    _await(plane, deadline, "kube-apiserver ready", lambda: _api_ok(server, token, pki.ca_cert))
    grace = node_monitor_grace(node_lease_seconds)
    start("kube-controller-manager", _controller_manager_args(plane.kubeconfig, ports, pki, grace))
    start("kube-scheduler", _scheduler_args(plane.kubeconfig, ports))
    start("kwok", _kwok_args(plane.kubeconfig, ports, node_lease_seconds))
    for name, port in (
        ("kube-controller-manager", ports.controller_manager),
        ("kube-scheduler", ports.scheduler),
    ):
        url = f"https://127.0.0.1:{port}/healthz"
        _await(plane, deadline, f"{name} healthy", functools.partial(_http_ok, url))
    _await(plane, deadline, "kwok healthy", lambda: _http_ok(f"http://127.0.0.1:{ports.kwok}/healthz"))
    # The default ServiceAccount proves the controller-manager's controllers are running;
    # pods cannot be created in a namespace before it exists.
    account = "/api/v1/namespaces/default/serviceaccounts/default"
    _await(plane, deadline, "default ServiceAccount", lambda: _api_ok(server, token, pki.ca_cert, account))


def _etcd_args(root: Path, ports: _Ports) -> list[str]:
    client, peer = f"http://127.0.0.1:{ports.etcd_client}", f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        f"--data-dir={root / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def _apiserver_args(root: Path, ports: _Ports, pki: _Pki) -> list[str]:
    return [
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--secure-port={ports.apiserver}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--tls-cert-file={pki.server_cert}",
        f"--tls-private-key-file={pki.server_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--token-auth-file={root / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_key}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--allow-privileged=true",
        f"--cert-dir={root / 'pki'}",
        "--v=1",
    ]


def _client_args(kubeconfig: Path, port: int) -> list[str]:
    """What the controller-manager and the scheduler share: credentials, no leader election."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        "--v=1",
    ]


def _controller_manager_args(kubeconfig: Path, ports: _Ports, pki: _Pki, grace_seconds: int) -> list[str]:
    return [
        *_client_args(kubeconfig, ports.controller_manager),
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        "--use-service-account-credentials=false",
        "--node-monitor-period=1s",  # notice new Ready nodes (and lift their not-ready taint) quickly
        # A deliberate API server outage (ControlPlane.apiserver_down) plus the minute client-go may
        # take to re-watch must not mark every KWOK node NotReady: its pods would stay unready for
        # good, since KWOK's pod stage, unlike a kubelet, never makes a running pod ready again.
        f"--node-monitor-grace-period={grace_seconds}s",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
    ]


def _scheduler_args(kubeconfig: Path, ports: _Ports) -> list[str]:
    return _client_args(kubeconfig, ports.scheduler)


def _kwok_args(kubeconfig: Path, ports: _Ports, node_lease_seconds: int) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--manage-nodes-with-label-selector=",
        f"--server-address=127.0.0.1:{ports.kwok}",
        f"--node-lease-duration-seconds={node_lease_seconds}",
        "--cidr=10.244.0.0/16",
        "--node-ip=10.0.0.1",
        f"--config={STAGES_DIR / 'nodes.yaml'}",
        f"--config={STAGES_DIR / 'pods.yaml'}",
    ]


# --- processes -----------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when the parent dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _starter(plane: ControlPlane, tools_bin: Path, logs: Path) -> Callable[[str, list[str]], None]:
    logs.mkdir(parents=True, exist_ok=True)

    def start(name: str, args: list[str]) -> None:
        log_path = logs / f"{name}.log"
        command = [str(tools_bin / name), *args]
        with log_path.open("wb") as log:
            process = _popen(command, log, plane.workdir)
        plane.components.append(Component(name, process, log_path, command))

    return start


def _popen(
    command: list[str], log: IO[bytes], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A component's process: output to its log, no stdin, killed when the parent dies."""
    return subprocess.Popen(
        command,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
        cwd=cwd,
    )


def _terminate(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _await(plane: ControlPlane, deadline: float, what: str, check: Callable[[], bool]) -> None:
    while True:
        plane.check_alive()
        if check():
            return
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c.name}\n{c.log_tail(10)}" for c in plane.components)
            raise ControlPlaneError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.1)


def _http_ok(url: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # local health probes only; the API itself is verified
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _api_ok(server: str, token: str, ca_cert: Path, path: str = "/readyz") -> bool:
    context = ssl.create_default_context(cafile=str(ca_cert))
    request = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _api_call(server: str, token: str, ca_cert: Path, method: str, path: str, body: Any = None) -> Any:
    """One JSON request to the API as the admin; None when it fails (the caller polls or cleans up)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(server + path, data=data, headers=headers, method=method)
    context = ssl.create_default_context(cafile=str(ca_cert))
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return json.loads(response.read())
    except (OSError, ValueError):  # URLError and HTTPError are OSErrors
        return None


# --- certificates and kubeconfig -----------------------------------------------------------------


@dataclass(frozen=True)
class _Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    sa_key: Path


def _write_pki(folder: Path) -> _Pki:
    """A throwaway CA, a serving certificate for 127.0.0.1, and a service-account signing key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ebbflow-local-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = _Pki(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "sa.key")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    pki.server_key.write_bytes(pem_key(server_key))
    pki.sa_key.write_bytes(pem_key(sa_key))
    return pki


def _write_kubeconfig(path: Path, server: str, ca_cert: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ebbflow-local", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": "ebbflow-local", "context": {"cluster": "ebbflow-local", "user": ADMIN_USER}}],
        "current-context": "ebbflow-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
