"""A local SeaweedFS for the object-store checkpoints' tests: one `weed server` process (master,
volume server, filer and S3 gateway) on loopback ports, its data in a directory of the test's,
S3 requests authenticated with the one identity of the kind cluster's store too (object_store.s3_config).

`start` returns once an object can be written and read back; `stop` ends it, `kill` is what a lost
store looks like (SIGKILL), and `restart` brings it back on the same ports and data. `weed` is built
by `make tools` (hack/build-tools.sh seaweedfs). Every port is chosen below the ephemeral range and
given explicitly, so that two stores of parallel tests never collide.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ebbflow_trainer.s3 import Credentials, S3Client, S3Error, S3Unreachable

from ebbflow_devtools.controlplane import DEFAULT_TOOLS_BIN
from ebbflow_devtools.object_store import ACCESS_KEY as ACCESS_KEY  # re-exported for the tests
from ebbflow_devtools.object_store import SECRET_KEY as SECRET_KEY
from ebbflow_devtools.object_store import s3_config
from ebbflow_devtools.ports import free_ports
from ebbflow_devtools.waiting import NotYet, wait_for

CREDENTIALS = Credentials(ACCESS_KEY, SECRET_KEY)
READY_TIMEOUT_S = 120
STOP_GRACE_S = 5


def weed_binary() -> Path:
    return DEFAULT_TOOLS_BIN / "weed"


def missing() -> str | None:
    """Why no store can start here (None: it can)."""
    if not weed_binary().exists():
        return f"{weed_binary()} is missing: run `make tools` (it builds SeaweedFS)"
    return None


@dataclass
class SeaweedFS:
    directory: Path
    ports: dict[str, int]
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def client(self, credentials: Credentials = CREDENTIALS) -> S3Client:
        return S3Client(self.endpoint, credentials, timeout=10)

    def _command(self) -> list[str]:
        config = self.directory / "s3.json"
        config.write_text(json.dumps(s3_config()))
        (self.directory / "data").mkdir(exist_ok=True)
        port = self.ports
        return [
            str(weed_binary()),
            "server",
            f"-dir={self.directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={port['master']}",
            f"-master.port.grpc={port['master_grpc']}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=256",
            f"-volume.port={port['volume']}",
            # Each bucket is a collection that takes 7 volumes at its first write: the default limit
            # of 8 volumes refuses the second bucket's writes (HTTP 500). 0: as many as the disk holds.
            "-volume.max=0",
            f"-volume.port.grpc={port['volume_grpc']}",
            f"-filer.port={port['filer']}",
            f"-filer.port.grpc={port['filer_grpc']}",
            "-s3",
            f"-s3.port={port['s3']}",
            f"-s3.port.grpc={port['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            f"-debug.port={port['debug']}",
            f"-metricsPort={port['metrics']}",
        ]

    def start(self) -> SeaweedFS:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._round_trip, READY_TIMEOUT_S, f"SeaweedFS's S3 gateway at {self.endpoint} ({self.log})")
        return self

    def _round_trip(self) -> bool | NotYet:
        """An object written and read back: the master, a volume, the filer and the gateway all work."""
        assert self.process is not None and self.process.poll() is None, f"weed exited: {self.tail()}"
        client = self.client()
        try:
            try:
                client.head_bucket("ebbflow-ready")
            except S3Error:
                client.create_bucket("ebbflow-ready")
            client.put_object("ebbflow-ready", "probe", b"ok")
            return client.get_object("ebbflow-ready", "probe") == b"ok" or NotYet("read back something else")
        except (S3Error, S3Unreachable) as error:
            return NotYet(str(error))

    def create_bucket(self, name: str) -> None:
        """The bucket, created unless it exists already."""
        try:
            self.client().create_bucket(name)
        except S3Error as error:
            if error.status != 409:  # BucketAlreadyExists / BucketAlreadyOwnedByYou
                raise

    def kill(self) -> None:
        """What losing the store looks like: the process dies at once, mid-request if one is running."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE_S (weed's shutdown can wait on its peers for 30 s;
        its data is on disk by then either way)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> SeaweedFS:
        """The same store back: same ports, same data."""
        self.stop()
        return self.start()

    def tail(self, characters: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.log.exists() else ""


def start(directory: Path) -> SeaweedFS:
    """A store with its data under `directory`, serving S3 once this returns."""
    directory.mkdir(parents=True, exist_ok=True)
    names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
    chosen = free_ports(len(names) + 2)
    ports = dict(zip((*names, "debug", "metrics"), chosen, strict=True))
    return SeaweedFS(directory, ports).start()
