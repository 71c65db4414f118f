"""`prewarm scheduler run` and `prewarm executor run` as real processes on the local stack."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_builders import models
from wait_helpers import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Registers `executor run` whether or not prewarm_cli/__init__.py imports its module yet.
MAIN = "import prewarm_cli._executor_run; from prewarm_cli import main; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGINT)
    for proc in started:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_hint_to_a_running_scheduler_reaches_a_running_executor(
    kafka_bootstrap: str, unique: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    catalog = models(tmp_path / "weights", 2)
    catalog.save(tmp_path / "catalog.yaml")
    node = f"node-{unique}"
    (tmp_path / "cluster.yaml").write_text(f"nodes:\n  - name: {node}\n")
    api, load_api = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update(
        {
            "PREWARM_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "PREWARM_TOPIC_ORDERS": f"orders-{unique}",
            "PREWARM_TOPIC_EXECUTOR_STATE": f"state-{unique}",
            "PREWARM_DATA_DIR": str(tmp_path),
            "PREWARM_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
            "PREWARM_CATALOG": str(tmp_path / "catalog.yaml"),
            "PREWARM_HINT_TOKENS": "shop:tok-123",
            "PREWARM_READ_TOKENS": "dashboard:read-456",
        }
    )
    scheduler_cmd = [sys.executable, "-c", MAIN, "--set", f"api_port={api}", "--set", "plan_interval_s=1"]
    scheduler_cmd += ["--set", f"cluster={tmp_path / 'cluster.yaml'}", "scheduler", "run"]
    executor_cmd = [
        sys.executable,
        "-c",
        MAIN,
        "--set",
        f"executor_api_port={load_api}",
        "--set",
        "device=cpu",
    ]
    executor_cmd += [
        "--set",
        "l0_budget=33554432",
        "--set",
        "l0_reserve_bytes=0",
        "--set",
        "l1_budget_bytes=64MB",
    ]
    executor_cmd += ["executor", "run", "--node", node, "--state-interval", "0.5"]
    for cmd in (scheduler_cmd, executor_cmd):
        processes.append(subprocess.Popen(cmd, cwd=REPO, env=env))

    def up(url: str) -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    # Each process imports torch, pandas and MLflow first: on two busy shared cores that alone has taken
    # most of a minute, so the deadline is generous (the wait ends as soon as the process answers).
    wait_for(lambda: up(f"http://127.0.0.1:{api}/readyz"), 120, "the scheduler to be ready")
    wait_for(lambda: up(f"http://127.0.0.1:{load_api}/healthz"), 120, "the executor to be healthy")
    hint = httpx.post(
        f"http://127.0.0.1:{api}/v1/hints",
        json={"model": "m0"},
        headers={"Authorization": "Bearer tok-123"},
        timeout=10,
    )
    assert hint.status_code == 202, hint.text

    def in_l1_or_l0() -> bool:
        state = httpx.get(f"http://127.0.0.1:{load_api}/v1/state", timeout=5).json()
        return any(
            t["tier"] in ("L0", "L1") and any(r["model"] == "m0" for r in t["resident"])
            for t in state["tiers"]
        )

    wait_for(in_l1_or_l0, 30, "m0 in the executor's L1 or L0")
    reader = {"Authorization": "Bearer read-456"}  # reads need a token too
    # The scheduler hears about it from the executor's report.
    wait_for(
        lambda: (
            "m0" in httpx.get(f"http://127.0.0.1:{api}/v1/plan", headers=reader, timeout=5).json()["tiers"]
        ),
        15,
        "m0 in the scheduler's plan",
    )
    # Both still answer after the round trip (a request each, not a pause), and neither has exited.
    assert up(f"http://127.0.0.1:{api}/readyz")
    assert up(f"http://127.0.0.1:{load_api}/healthz")
    assert all(p.poll() is None for p in processes)
