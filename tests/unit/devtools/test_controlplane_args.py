"""The local control plane's arguments: bad ones fail before any process starts."""

from pathlib import Path

import pytest
from ebbflow_devtools.controlplane import (
    MAX_NODE_LEASE_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
    node_monitor_grace,
    start_control_plane,
)


@pytest.mark.parametrize(
    "seconds",
    [pytest.param(0, id="zero"), pytest.param(MAX_NODE_LEASE_SECONDS + 1, id="over-an-hour")],
)
def test_a_node_lease_out_of_range_is_refused_by_name(seconds: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"node_lease_seconds=.*pass 1 to"):
        start_control_plane(
            workdir=tmp_path / "plane", tools_bin=tmp_path / "no-tools", node_lease_seconds=seconds
        )
    assert not (tmp_path / "plane").exists()


@pytest.mark.parametrize(
    ("lease", "grace"),
    [
        pytest.param(40, NODE_MONITOR_GRACE_SECONDS, id="kubelet-default"),
        pytest.param(180, 180, id="equal"),
        pytest.param(400, 400, id="5000-nodes"),
    ],
)
def test_the_node_monitor_grace_covers_three_late_renewals(lease: int, grace: int) -> None:
    assert node_monitor_grace(lease) == grace
    assert node_monitor_grace(lease) >= lease  # a renewal every quarter may lag three quarters
