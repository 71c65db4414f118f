from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from prewarm_cli import app

KEYS = {
    "reactive_wait_s",
    "prewarm_wait_s",
    "wait_ratio",
    "reactive_p99_s",
    "prewarm_p99_s",
    "prefetches",
    "mispredictions",
    "misprediction_rate",
    "over_commit_bytes",
}


def test_bench_sim_writes_the_comparison_as_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = [
        "bench",
        "sim",
        "--models",
        "7",
        "--days",
        "3",
        "--nodes",
        "1",
        "--hours",
        "1",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data.keys() >= KEYS
    assert data["over_commit_bytes"] == 0
    assert data["setup"]["nodes"] == 1
    assert data["reports"]["reactive"]["requests"] == data["reports"]["prewarm"]["requests"]


def _refused(args: list[str], message: str) -> None:
    """The command exits with a usage error (2) that says ``message``."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_sim_run_rejects_an_unknown_trace_format(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model\n1704067200,m0\n")
    _refused(
        ["sim", "run", "--trace", str(trace), "--format", "parquet"],
        "expected one of requests, azure2019, azure2021",
    )


def test_bench_policy_refuses_a_negative_draw_before_building_any_case() -> None:
    _refused(["bench", "policy", "--draw", "-1"], "--draw is 0 (the suite) or a positive number, not -1")


def test_bench_policy_refuses_a_cluster_file_named_like_a_setting_of_the_suite(tmp_path: Path) -> None:
    cluster = tmp_path / "tight.yaml"
    cluster.write_text(
        "nodes:\n- {name: n0, gpus: [{memory_bytes: 80GB}], host_cache_bytes: 64GB, disk_cache_bytes: 1TB}\n"
    )
    _refused(["bench", "policy", "--cluster", str(cluster)], "its name 'tight' is taken")


def _azure_samples_bench(tmp_path: Path, option: str, cluster: Path) -> Any:
    """``bench policy`` on the azure_samples case with ``option cluster``: its JSON report."""
    out = tmp_path / "bench.json"
    args = ["bench", "policy", "--case", "azure_samples", option, str(cluster), "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_bench_policy_runs_the_suite_on_a_cluster_file_and_judges_it_as_tight(tmp_path: Path) -> None:
    cluster = tmp_path / "wide.yaml"
    cluster.write_text(
        "nodes:\n"
        + "".join(
            f"- {{name: n{k}, gpus: [{{memory_bytes: 80GB}}, {{memory_bytes: 80GB}}], "
            "host_cache_bytes: 128GB, disk_cache_bytes: 2TB}\n"
            for k in range(3)
        )
    )
    report = _azure_samples_bench(tmp_path, "--cluster", cluster)
    assert list(report["runs"]["azure_samples"]) == ["wide"]
    assert set(report["runs"]["azure_samples"]["wide"]) == {
        "reactive",
        "keepalive:600",
        "histogram",
        "oracle",
        "prewarm",
    }
    targets = report["targets"]
    assert {t["setting"] for t in targets} == {"wide"}
    assert [t["name"].split(" ")[0] for t in targets] == [">5", "idle", ">5", "mispredictions"]


def test_bench_policy_runs_the_suite_on_roomy_nodes_like_a_cluster_files_and_judges_them_as_roomy(
    tmp_path: Path,
) -> None:
    node = tmp_path / "pair.yaml"
    node.write_text(
        "nodes:\n- {name: n0, gpus: [{memory_bytes: 80GB}, {memory_bytes: 80GB}], host_cache_bytes: 64GB}\n"
    )
    report = _azure_samples_bench(tmp_path, "--roomy-like", node)
    assert list(report["runs"]["azure_samples"]) == ["roomy-pair"]
    assert [(t["setting"], t["name"]) for t in report["targets"]] == [
        ("roomy-pair", "cold starts ≤ reactive")
    ]


def test_bench_policy_refuses_roomy_nodes_whose_gpus_cannot_hold_the_largest_model(tmp_path: Path) -> None:
    node = tmp_path / "small.yaml"
    node.write_text("nodes:\n- {name: n0, gpus: [{memory_bytes: 80GB}]}\n")
    _refused(
        ["bench", "policy", "--case", "azure_samples", "--roomy-like", str(node)],
        "the GPUs of node n0 cannot hold a model of",
    )
