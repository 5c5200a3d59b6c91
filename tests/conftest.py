"""Marks every test with its tier from the folder it lives in, so `pytest -m unit` etc. select tiers."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "trainer", "integration", "e2e")
TESTS_ROOT = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(item.fspath).relative_to(TESTS_ROOT).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
