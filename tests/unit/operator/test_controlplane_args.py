"""The local control plane's arguments: bad ones fail before any process starts."""

from pathlib import Path

import pytest
from ebbflow_operator.devcluster.controlplane import NODE_MONITOR_GRACE_SECONDS, start_control_plane


@pytest.mark.parametrize(
    "seconds",
    [pytest.param(0, id="zero"), pytest.param(4 * NODE_MONITOR_GRACE_SECONDS, id="renewal-past-grace")],
)
def test_a_node_lease_kwok_cannot_renew_in_time_is_refused_by_name(seconds: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"node_lease_seconds=.*pass 1 to"):
        start_control_plane(
            workdir=tmp_path / "plane", tools_bin=tmp_path / "no-tools", node_lease_seconds=seconds
        )
    assert not (tmp_path / "plane").exists()
