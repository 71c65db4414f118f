"""Render the Helm chart offline with the helm that `make tools` installs, and read what came out."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "prewarm"
HELM = REPO / ".tools" / "bin" / "helm"
PRODUCTION = CHART / "values-production.yaml"
RELEASE = "prewarm"
NAMESPACE = "prewarm"

__all__ = [
    "CHART",
    "PRODUCTION",
    "REPO",
    "RenderError",
    "containers",
    "env_of",
    "kinds",
    "lint",
    "need_helm",
    "one",
    "pod_spec",
    "render",
    "workloads",
]

Obj = dict[str, Any]


class RenderError(Exception):
    """helm template refused the values; the message is helm's."""


def need_helm() -> Path:
    """The helm binary; without it the test is skipped here and fails under CI (`make test` runs
    `make tools` first, so a missing helm there is a broken setup, not a reason to pass)."""
    if HELM.is_file() and os.access(HELM, os.X_OK):
        return HELM
    message = f"{HELM.relative_to(REPO)} is missing: run `make tools`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def render(*args: str, values: Path | None = None) -> list[Obj]:
    """``helm template`` of the chart (with ``values`` and ``--set``-style ``args``) as objects."""
    helm = need_helm()
    command = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if values is not None:
        command += ["--values", str(values)]
    result = subprocess.run([*command, *args], capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def lint(values: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm lint --strict`` of the chart: its own checks (Chart.yaml, templates, values)."""
    command = [str(need_helm()), "lint", "--strict", str(CHART)]
    if values is not None:
        command += ["--values", str(values)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


def kinds(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str, component: str) -> Obj:
    found = [
        o for o in kinds(objects, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects of component {component}"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["spec"])


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "CronJob")]


def containers(workload: Obj, init: bool = False) -> Iterator[Obj]:
    yield from pod_spec(workload).get("initContainers" if init else "containers", [])


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}
