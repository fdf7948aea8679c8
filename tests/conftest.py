"""Test-wide settings: offline, quiet Ray; no usage reporting from CI machines; the default suite.

``python -m pytest`` (no paths: the ``testpaths``) is the default suite: tests marked ``slow`` or
``stress`` are deselected, and ``.ci/run`` runs them in a second step (``-m "slow or stress"``).
Naming files or tests (``python -m pytest tests/test_ray.py``) or giving ``-m`` runs what was asked.
"""

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")

LEFT_TO_THE_SLOW_STEP = ("slow", "stress")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.option.markexpr or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in LEFT_TO_THE_SLOW_STEP) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
