"""Test-wide settings: offline, quiet Ray; no usage reporting from CI machines."""

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
