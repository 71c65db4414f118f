"""`prewarm executor run --standalone --socket-dir` as a real process: the load API honours the tier,
writes need the token off localhost, and an engine process takes the weights over the socket."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from checkpoint_kit import REPO, engine_env, start_engine
from executor_testkit import executor_settings, make_model, s3_settings
from fastapi.testclient import TestClient
from wait_helpers import wait_for

from executor import Executor
from executor._http import check_binding, create_app
from models import Catalog
from prewarm import ConfigError, Tier

MAIN = "import prewarm_cli._executor_run; from prewarm_cli import main; main()"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def catalog_file(tmp_path: Path) -> Path:
    catalog = Catalog(make_model(tmp_path / "weights", f"m{i}", seed=i) for i in range(2))
    catalog.save(tmp_path / "catalog.yaml")
    return tmp_path / "catalog.yaml"


def _command(port: int, *args: str, host: str = "127.0.0.1") -> list[str]:
    sets = {
        "executor_api_host": host,
        "executor_api_port": str(port),
        "device": "cpu",
        "l0_budget": str(32 * 2**20),
        "l0_reserve_bytes": "0",
        "l1_budget_bytes": str(32 * 2**20),
    }
    command = [sys.executable, "-c", MAIN]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    return [*command, "executor", "run", *args]


@pytest.fixture
def standalone(tmp_path: Path, catalog_file: Path) -> Iterator[tuple[httpx.Client, Path]]:
    port, sockets = _free_port(), tmp_path / "sockets"
    args = ["--node", "n1", "--catalog", str(catalog_file), "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.Popen(
        _command(port, *args, "--socket-dir", str(sockets), "--standalone"),
        env=engine_env(),
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"executor exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            return http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 120, "the standalone executor's API")
        yield http, sockets
    finally:
        http.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_standalone_executor_loads_to_the_tier_asked_and_hands_the_block_to_an_engine(
    standalone: tuple[httpx.Client, Path],
) -> None:
    http, sockets = standalone
    loaded = http.post("/v1/load", json={"model": "m0", "tier": "L1"})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["tier"] == "L1"
    tiers = {t["tier"]: t for t in http.get("/v1/state").json()["tiers"]}
    assert [r["model"] for r in tiers["L1"]["resident"]] == ["m0"]
    assert tiers["L0"]["resident"] == []  # today's behaviour (L0 for any tier) is gone

    engine = start_engine(
        """
        import json, sys
        from prewarm_client import open_weights
        with open_weights("m0", socket_dir=sys.argv[1]) as weights:
            print(json.dumps({"served_from": weights.served_from, "n": len(weights)}), flush=True)
            sys.stdin.readline()
        """,
        str(sockets),
    )
    assert engine.stdout is not None
    assert engine.stdin is not None
    got = json.loads(engine.stdout.readline() or "{}")
    assert got["served_from"] == "L1"

    def leases() -> int:
        l1 = {t["tier"]: t for t in http.get("/v1/state").json()["tiers"]}["L1"]
        return int(l1["resident"][0]["leases"])

    assert leases() == 1
    assert b"prewarm_executor_leases 1.0" in http.get("/metrics").content
    engine.stdin.write("\n")
    engine.stdin.flush()
    engine.wait(30)
    wait_for(lambda: leases() == 0, 10, "the engine's lease to end")
    assert b"prewarm_executor_lease_wait_seconds_count" in http.get("/metrics").content


def test_executor_api_refuses_to_listen_off_localhost_without_a_token(
    tmp_path: Path, catalog_file: Path
) -> None:
    with pytest.raises(ConfigError, match="without a token"):
        check_binding("0.0.0.0", None)
    check_binding("0.0.0.0", "secret")
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    # And the command itself stops before serving anything.
    args = ["--catalog", str(catalog_file), "--cache-dir", str(tmp_path / "cache"), "--standalone"]
    done = subprocess.run(
        _command(_free_port(), *args, host="0.0.0.0"),
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "without a token" in done.stderr


def test_load_api_honours_the_tier_and_needs_the_token_for_writes(api: tuple[Executor, TestClient]) -> None:
    executor, client = api
    assert client.post("/v1/load", json={"model": "m0", "tier": "L1"}).status_code == 401
    headers = {"Authorization": "Bearer s3cret"}
    assert (
        client.post("/v1/load", json={"model": "m0"}, headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    for tier in ("L2", "L1", "L0"):
        reply = client.post("/v1/load", json={"model": "m0", "tier": tier}, headers=headers)
        assert reply.status_code == 200, reply.text
        assert reply.json()["tier"] == tier
        held = {t.tier: [r.model for r in t.resident] for t in executor.state().tiers}
        assert "m0" in held[Tier(tier)]
    assert client.post("/v1/load", json={"model": "m0", "tier": "L3"}, headers=headers).status_code == 422
    assert client.get("/v1/state").status_code == 200  # reads need no token


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Executor, TestClient]]:
    catalog = Catalog([make_model(tmp_path / "weights", "m0", seed=0)])
    executor = Executor(
        catalog, executor=executor_settings(), s3=s3_settings(), cache_dir=tmp_path / "cache", direct_l0=False
    )
    app = create_app(executor, node="n", healthy=lambda: True, loaded=lambda: None, token="s3cret")
    with TestClient(app) as client:
        yield executor, client
    executor.close()
