from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prewarm_cli import app
from sim import LONG_TAIL_MIX, default_cluster, long_tail

ROW_KEYS = {"policy", "world", "requests", "seconds", "requests_per_s", "stable", "offered_load"}


def test_sim_speed_on_a_long_tail_of_8_gpu_nodes_reports_each_policy_with_its_stability(
    tmp_path: Path,
) -> None:
    out = tmp_path / "speed.json"
    args = ["bench", "sim-speed", "--trace", "long-tail", "--models", "200", "--nodes", "2", "--gpus", "8"]
    args += ["--hours", "1", "--world", "cluster", "--policy", "reactive", "--policy", "histogram"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["setup"]["gpus"] == 8
    assert data["setup"]["trace"] == "long-tail"
    assert [row["policy"] for row in data["rows"]] == ["reactive", "histogram"]
    for row in data["rows"]:
        assert row.keys() >= ROW_KEYS
        assert row["world"] == "2 nodes x 8 GPUs"
        assert row["requests"] == data["setup"]["window_requests"] > 0
        assert isinstance(row["stable"], bool)


def test_sim_speed_rejects_an_unknown_trace(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "sim-speed", "--trace", "zipf"])
    assert result.exit_code != 0
    assert "--trace must be speed or long-tail" in result.output


def test_default_cluster_keeps_two_gpu_nodes_and_scales_host_and_disk_with_gpus() -> None:
    two, eight = default_cluster(1).nodes[0], default_cluster(1, 8).nodes[0]
    assert (len(two.gpus), two.host_cache_bytes, two.disk_cache_bytes) == (2, 400 * 10**9, 2 * 10**12)
    assert (len(eight.gpus), eight.host_cache_bytes, eight.disk_cache_bytes) == (8, 1600 * 10**9, 8 * 10**12)


def test_long_tail_sizes_follow_the_mix_and_the_trace_covers_warmup_and_window() -> None:
    fleet = long_tail(1000, 2, seed=1)
    sizes = [spec.size_bytes // 10**9 for spec in fleet.catalog]
    assert len(sizes) == 1000
    for gb, share in LONG_TAIL_MIX.items():
        assert abs(sizes.count(int(gb)) / 1000 - share) < 0.005
    stamps = fleet.events["timestamp"]
    assert stamps.min() < fleet.start - 3 * 3600
    assert stamps.max() < fleet.end == fleet.start + 7200
