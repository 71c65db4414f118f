"""``prewarm bench plan`` writes the figures its contract names, for one size and for several."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prewarm_cli import app

CONTRACT = {"models", "nodes", "gpus", "round_p50_s", "round_p99_s", "hint_p50_s", "hint_p99_s"}


def run(tmp_path: Path, models: str) -> dict[str, object]:
    out = tmp_path / "plan.json"
    args = ["bench", "plan", "--models", models, "--nodes", "3", "--gpus", "2", "--rounds", "2"]
    result = CliRunner().invoke(app, [*args, "--hints", "5", "--baseline-hints", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    return dict(json.loads(out.read_text()))


def test_bench_plan_writes_round_and_hint_percentiles_as_json(tmp_path: Path) -> None:
    result = run(tmp_path, "40")
    assert result.keys() >= CONTRACT
    assert (result["models"], result["nodes"], result["gpus"]) == (40, 3, 2)
    assert 0 < result["round_p50_s"] <= result["round_p99_s"]  # type: ignore[operator]
    assert 0 < result["hint_p50_s"] <= result["hint_p99_s"]  # type: ignore[operator]
    # Each hint is on a model outside GPU memory, against room enough: each is a fresh prefetch.
    assert result["hints"] == result["hints_with_orders"] == 5


def test_bench_plan_measures_several_catalog_sizes_in_one_run(tmp_path: Path) -> None:
    result = run(tmp_path, "20,40")
    runs = result["runs"]
    assert isinstance(runs, list)
    assert [r["models"] for r in runs] == [20, 40]
    assert all(r.keys() >= CONTRACT for r in runs)
    assert result["models"] == 40  # the top level is the last size's
