"""``prewarm executor load|verify|state`` and ``prewarm bench load`` from the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models import Catalog
from prewarm_cli import app


@pytest.fixture(autouse=True)
def _no_stack_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("PREWARM_"):
            monkeypatch.delenv(key)


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_load_reports_where_the_model_came_from(catalog: Catalog, tmp_path: Path) -> None:
    catalog.save(tmp_path / "catalog.yaml")
    common = ["--catalog", str(tmp_path / "catalog.yaml"), "--cache-dir", str(tmp_path / "c")]
    code, _ = _run("executor", "load", "m0", *common, "--tier", "L2", "--json", str(tmp_path / "a.json"))
    assert code == 0
    code, _ = _run(
        "executor",
        "load",
        "m0",
        *common,
        "--tier",
        "L0",
        "--device",
        "cpu",
        "--json",
        str(tmp_path / "b.json"),
    )
    assert code == 0
    first = json.loads((tmp_path / "a.json").read_text())
    second = json.loads((tmp_path / "b.json").read_text())
    assert first["served_from"] == "L3"
    assert second == {
        "model": "m0",
        "version": "1",
        "served_from": "L2",
        "tier": "L0",
        "bytes": catalog["m0"].size_bytes,
        "seconds_per_hop": second["seconds_per_hop"],
        "verified": True,
    }
    assert set(second["seconds_per_hop"]) == {"L2->L0"}


def test_verify_finds_a_corrupt_object_and_state_lists_the_rest(catalog: Catalog, tmp_path: Path) -> None:
    catalog.save(tmp_path / "catalog.yaml")
    common = ["--catalog", str(tmp_path / "catalog.yaml"), "--cache-dir", str(tmp_path / "c")]
    for model in ("m0", "m1"):
        assert _run("executor", "load", model, *common, "--tier", "L2")[0] == 0
    code, out = _run("executor", "verify", "--cache-dir", str(tmp_path / "c"))
    assert code == 0
    assert "2/2 objects intact" in out
    victim = tmp_path / "c" / "objects" / catalog["m1"].sha256[:2] / catalog["m1"].sha256  # type: ignore[index]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))

    code, out = _run("executor", "verify", "--cache-dir", str(tmp_path / "c"))
    assert code == 1
    assert "BAD" in out

    code, _ = _run("executor", "state", *common, "--json", str(tmp_path / "state.json"))
    assert code == 0
    state = json.loads((tmp_path / "state.json").read_text())
    l2 = next(t for t in state["tiers"] if t["tier"] == "L2")
    assert [r["model"] for r in l2["resident"]] == ["m0"]


def test_bench_load_writes_every_key(tmp_path: Path) -> None:
    code, out = _run(
        "bench", "load", "--size", "8MiB", "--device", "cpu", "--dir", str(tmp_path / "b"),
        "--json", str(tmp_path / "bench.json"),
    )  # fmt: skip
    assert code == 0, out
    report = json.loads((tmp_path / "bench.json").read_text())
    for key in (
        "file_bytes", "device", "page_cache_dropped", "raw_read_bytes_per_s",
        "baseline_safetensors_bytes_per_s", "l2_to_l1_bytes_per_s", "l1_to_l0_bytes_per_s",
        "l2_to_l0_bytes_per_s", "s3_baseline_bytes_per_s", "l3_to_l1_bytes_per_s",
    ):  # fmt: skip
        assert key in report
    assert report["l2_to_l0_bytes_per_s"] > 0
    assert report["s3_baseline_bytes_per_s"] is None  # no endpoint in this test
    assert len(report["ratios_per_run"]["l2_to_l1_vs_raw_read"]) == report["repeat"]
    assert "l3_to_l1_vs_download_file" not in report["ratios_per_run"]


def test_gpu_check_runs_every_device_path_and_reports(tmp_path: Path) -> None:
    from executor._gpucheck import main

    # On the CPU device here; on a GPU node the same script drives the CUDA paths.
    main(
        [
            "--size",
            "8MiB",
            "--device",
            "cpu",
            "--dir",
            str(tmp_path / "g"),
            "--json",
            str(tmp_path / "g.json"),
        ]
    )

    report = json.loads((tmp_path / "g.json").read_text())
    assert report["correctness"] == "ok"
    assert report["device"] == "cpu"
    assert set(report["targets"]) <= set(report["ratios"])
