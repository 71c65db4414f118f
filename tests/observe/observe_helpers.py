"""What the observability tests share: the metric names the code exports, and tools that may be missing.

The names are read from prewarm's registry after importing every module of the packages that define
metrics, never from strings in the code: a metric a module only mentions, or one renamed in the code but
not in the dashboard, is caught.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil

import pytest

from prewarm import REGISTRY

__all__ = ["REPO_TOOLS", "exported_sample_names", "need_tool"]

# Packages whose modules register metrics (the CLI only calls them).
_PACKAGES = ("prewarm", "models", "ingest", "forecaster", "scheduler", "executor")
# The sample names Prometheus scrapes for each kind of family prometheus_client registers.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}
REPO_TOOLS = {"promtool": "prometheus", "chromium": "chromium", "chromedriver": "chromium-driver"}


def exported_sample_names() -> set[str]:
    for name in _PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            importlib.import_module(module.name)
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def need_tool(command: str) -> str:
    """The path of ``command``; skips (fails under CI=true) when ``deploy/bootstrap.sh`` could not
    install it."""
    path = shutil.which(command)
    if path is None:
        why = (
            f"{command} is not installed: deploy/bootstrap.sh installs Debian's {REPO_TOOLS[command]} "
            "package when it runs as root with apt-get"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return path
