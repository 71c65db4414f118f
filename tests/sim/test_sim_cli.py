from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from ingest import generate
from prewarm_cli import app
from sim import virtual_catalog

# The keys of the ``prewarm sim run --json`` contract (issue 11).
CONTRACT = {
    "requests",
    "cold_starts",
    "cold_start_rate",
    "p75_model_cold_start_rate",
    "share_wait_over_1s",
    "share_wait_over_5s",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p99_s",
    "wait_max_s",
    "idle_gb_minutes",
    "prefetches",
    "mispredictions",
    "bytes_moved",
    "stable",
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    generate(7, 3, seed=5).events.to_csv(path, index=False)
    return path


def _sim_run(trace: Path, out: Path, *extra: str) -> dict[str, dict[str, Any]]:
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "2", *extra]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data: dict[str, dict[str, Any]] = json.loads(out.read_text())
    return data


def test_sim_run_writes_one_document_keyed_by_each_policy_label_as_given(trace: Path, tmp_path: Path) -> None:
    labels = ["reactive", "keepalive:300", "oracle", "prewarm"]
    data = _sim_run(trace, tmp_path / "out.json", *(a for label in labels for a in ("--policy", label)))
    assert list(data) == labels
    for label, metrics in data.items():
        assert set(metrics) >= CONTRACT, label
        assert set(metrics["idle_gb_minutes"]) == {"L0", "L1", "L2"}
        assert isinstance(metrics["stable"], bool)
    requests = {m["requests"] for m in data.values()}
    assert len(requests) == 1
    assert requests.pop() > 0


def test_sim_run_unlimited_reports_gpu_memory_only_and_needs_no_cluster(trace: Path, tmp_path: Path) -> None:
    hints = tmp_path / "hints.csv"
    hints.write_text("timestamp,model,ttl_s\n1704153600,syn-0001,600\n")
    data = _sim_run(
        trace,
        tmp_path / "out.json",
        "--unlimited",
        "--hints",
        str(hints),
        "--policy",
        "keepalive:600",
        "--policy",
        "oracle",
    )
    assert list(data) == ["keepalive:600", "oracle"]
    assert set(data["oracle"]["idle_gb_minutes"]) == {"L0"}
    assert data["oracle"]["cold_starts"] == 0


def test_sim_run_says_a_cluster_given_with_unlimited_is_not_used(trace: Path, tmp_path: Path) -> None:
    cluster = Path(__file__).resolve().parents[2] / "data" / "clusters" / "thin.yaml"
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "1", "--unlimited"]
    result = CliRunner().invoke(app, [*args, "--cluster", str(cluster), "--policy", "keepalive:600"])
    assert result.exit_code == 0, result.output
    assert f"--cluster {cluster} is not used with --unlimited" in result.output


@pytest.mark.parametrize(
    ("train_days", "sim_hours", "said"),
    [
        ("3", "2", "no request in the 2 hours after the first 3 days: the trace's requests span 2.99 days"),
        ("2", "0", "the simulated span must be a positive number of hours"),
        ("nan", "2", "the training span must be a positive number of days"),
        ("-1", "2", "the training span must be a positive number of days"),
        (
            "2",
            "1e9",
            "past the trace's last request: the trace's requests span 2.99 days; simulate at most 47 hours",
        ),
    ],
)
def test_sim_run_refuses_a_split_that_leaves_nothing_to_train_on_or_to_simulate(
    trace: Path, train_days: str, sim_hours: str, said: str
) -> None:
    result = CliRunner().invoke(
        app, ["sim", "run", "--trace", str(trace), "--train-days", train_days, "--sim-hours", sim_hours]
    )
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_sim_run_warns_of_a_window_running_hours_past_the_traces_last_request(
    trace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The trace ends 23.8 hours after its first two days: a 40-hour window runs 16 hours past its end,
    # hours in which only idle memory is counted.
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "40"]
    with caplog.at_level("WARNING", logger="sim._run"):
        result = CliRunner().invoke(app, [*args, "--unlimited", "--policy", "keepalive:600"])
    assert result.exit_code == 0, result.output
    [record] = [r for r in caplog.records if "past the trace's last request" in r.getMessage()]
    assert record.hours_past == pytest.approx(16.2, abs=0.2)  # type: ignore[attr-defined]


def test_sim_run_rejects_an_unknown_policy(trace: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "1", "--policy", "lru"]
    )
    assert result.exit_code == 2, result.output
    assert "unknown policy 'lru'" in result.output


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (["reactive", "keepalive:soon"], "knob 'soon' is not a number"),
        (["oracle", "oracle"], "labels repeat"),
    ],
)
def test_sim_run_refuses_a_bad_or_repeated_policy_label_before_it_fits_the_forecaster(
    trace: Path, labels: list[str], said: str
) -> None:
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "1"]
    with patch("sim._run.fit_forecasts", side_effect=AssertionError("fitted before the labels were checked")):
        result = CliRunner().invoke(app, [*args, *(a for label in labels for a in ("--policy", label))])
    assert result.exit_code == 2, result.output
    assert said in result.output


@pytest.mark.parametrize("where", ["folder", "under a file"])
def test_sim_run_refuses_a_json_path_no_file_can_be_written_to_before_it_simulates(
    trace: Path, tmp_path: Path, where: str
) -> None:
    out = tmp_path if where == "folder" else trace / "out.json"
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "1"]
    with patch("ingest.read_trace", side_effect=AssertionError("read the trace before the path was checked")):
        result = CliRunner().invoke(app, [*args, "--policy", "reactive", "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--json'" in result.output


def test_sim_run_refuses_a_histogram_range_past_a_week_before_allocating_its_bins(trace: Path) -> None:
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", "1"]
    result = CliRunner().invoke(app, [*args, "--policy", "histogram:1e9"])
    assert result.exit_code == 2, result.output
    assert "whole number of minutes from 1 to 10,080" in result.output


def test_sim_run_trains_on_one_azure_2019_day_file_and_simulates_the_next(
    azure_samples: Path, tmp_path: Path
) -> None:
    day = azure_samples / "invocations.csv"
    args = ["sim", "run", "--trace", str(day), "--trace", str(day), "--format", "azure2019"]
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--train-days",
            "1",
            "--sim-hours",
            "24",
            "--unlimited",
            "--policy",
            "reactive",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    day_requests = int(pd.read_csv(day).filter(regex=r"^\d+$").to_numpy().sum())
    assert json.loads(out.read_text())["reactive"]["requests"] == day_requests  # the second day, whole


def test_sim_run_reads_an_azure_2021_trace_as_the_same_requests(trace: Path, tmp_path: Path) -> None:
    events = pd.read_csv(trace)
    hashes = {m: hashlib.sha256(m.encode()).hexdigest() for m in events["model"].unique()}
    start = float(events["timestamp"].min())
    azure = tmp_path / "azure2021.csv"
    pd.DataFrame(
        {
            "app": "app0",
            "func": events["model"].map(hashes),
            "end_timestamp": events["timestamp"] - start + 0.25,
            "duration": 0.25,
        }
    ).to_csv(azure, index=False)
    as_requests = _sim_run(trace, tmp_path / "a.json", "--policy", "reactive")
    as_azure = _sim_run(azure, tmp_path / "b.json", "--policy", "reactive", "--format", "azure2021")
    assert as_azure["reactive"]["requests"] == as_requests["reactive"]["requests"] > 0


def _run_with_catalog(trace: Path, tmp_path: Path, models: list[str], sim_hours: str, *extra: str) -> Result:
    """``sim run`` of reactive on ``trace`` with a catalog of ``models`` alone."""
    catalog = tmp_path / "catalog.yaml"
    virtual_catalog(models).save(catalog)
    args = ["sim", "run", "--trace", str(trace), "--train-days", "2", "--sim-hours", sim_hours, *extra]
    return CliRunner().invoke(app, [*args, "--catalog", str(catalog), "--policy", "reactive"])


def test_sim_run_says_which_requests_it_does_not_simulate_for_want_of_a_catalog_entry(
    trace: Path, tmp_path: Path
) -> None:
    models = sorted(set(pd.read_csv(trace)["model"]) - {"syn-0001"})
    result = _run_with_catalog(trace, tmp_path, models, "2")
    assert result.exit_code == 0, result.output
    assert "model(s) missing from the catalog are not simulated: syn-0001" in result.output


def test_sim_run_leaves_out_the_hints_for_models_outside_the_catalog_and_says_so(
    trace: Path, tmp_path: Path
) -> None:
    events = pd.read_csv(trace)
    models = sorted(set(events["model"]))
    start = float(events["timestamp"].min()) + 2 * 86400
    hints = tmp_path / "hints.csv"
    rows = [f"{start + 60},{models[0]},600", f"{start + 120},retired-model,600"]
    hints.write_text("timestamp,model,ttl_s\n" + "\n".join(rows) + "\n")
    result = _run_with_catalog(trace, tmp_path, models, "2", "--hints", str(hints))
    assert result.exit_code == 0, result.output
    assert "1 hints for 1 model(s) missing from the catalog are not simulated: retired-model" in result.output


def test_sim_run_refuses_a_window_whose_requests_are_all_for_models_outside_the_catalog(
    trace: Path, tmp_path: Path
) -> None:
    result = _run_with_catalog(trace, tmp_path, ["other-model"], "1")
    assert result.exit_code == 2, result.output
    assert "requests in the simulated window is for a model of the catalog" in result.output
