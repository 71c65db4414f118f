from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from prewarm import InvalidInput, load_settings
from prewarm_cli._sweep import parse_grid
from prewarm_cli._sweep import sweep as sweep_command
from sim import DEFAULT_KNOBS, dominated, label_grid, pareto_front, sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

coords = st.floats(min_value=0.0, max_value=1e6, allow_nan=False) | st.sampled_from([0.0, 1.0, 2.0])
point_sets = st.lists(st.tuples(coords, coords), min_size=1, max_size=30)


@given(point_sets)
def test_no_front_point_is_dominated(points: list[tuple[float, float]]) -> None:
    front = pareto_front(points)
    for p, on in zip(points, front, strict=True):
        if on:
            assert not any(dominated(p, q) for q in points)


@given(point_sets)
def test_every_point_off_the_front_is_dominated_by_a_front_point(points: list[tuple[float, float]]) -> None:
    front = pareto_front(points)
    on_front = [p for p, on in zip(points, front, strict=True) if on]
    assert on_front  # a finite set always has a front
    for p, on in zip(points, front, strict=True):
        if not on:
            assert any(dominated(p, q) for q in on_front)


def test_equal_points_are_both_on_the_front() -> None:
    assert pareto_front([(1.0, 1.0), (1.0, 1.0), (2.0, 2.0)]) == [True, True, False]


def test_hand_made_front() -> None:
    points = [(10.0, 0.5), (20.0, 0.2), (30.0, 0.2), (40.0, 0.0), (15.0, 0.6), (5.0, 0.9)]
    assert pareto_front(points) == [True, True, False, True, False, True]


def test_label_grid_gives_each_knob_and_bare_kinds() -> None:
    assert label_grid({"reactive": (), "keepalive": ("60", "600"), "histogram": ("240",)}) == [
        "reactive",
        "keepalive:60",
        "keepalive:600",
        "histogram:240",
    ]


def _metrics(idle_l0: float, idle_l1: float, p75: float, wait5: float) -> dict[str, Any]:
    return {
        "requests": 100,
        "p75_model_cold_start_rate": p75,
        "share_wait_over_5s": wait5,
        "idle_gb_minutes": {"L0": idle_l0, "L1": idle_l1, "L2": 1e9},  # L2 never counts
    }


# A made-up world in which each label's metrics are known: what the simulator would return.
TABLE: dict[str, dict[str, Any]] = {
    "reactive": _metrics(0.0, 0.0, 1.0, 0.8),
    "keepalive:60": _metrics(100.0, 0.0, 0.8, 0.5),
    "keepalive:600": _metrics(600.0, 0.0, 0.4, 0.3),
    "keepalive:3600": _metrics(3000.0, 600.0, 0.4, 0.1),  # no better on p75 than 600, better on wait
    "histogram:120": _metrics(200.0, 50.0, 0.3, 0.4),
    "histogram:240": _metrics(400.0, 50.0, 0.35, 0.45),  # worse than 120 on both
}


def _run(labels: list[str]) -> Mapping[str, Mapping[str, Any]]:
    return {label: TABLE[label] for label in labels}


POLICIES = {"reactive": (), "keepalive": ("60", "600", "3600"), "histogram": ("120", "240")}


def test_sweep_places_each_label_on_its_own_familys_fronts() -> None:
    result = sweep(_run, POLICIES)
    by = {p.label: p for p in result.points}
    assert list(by) == label_grid(POLICIES)
    assert by["keepalive:3600"].idle_gb_minutes == 3600.0  # L0 + L1, not L2
    assert by["keepalive:3600"].knob == "3600"
    assert by["reactive"].knob is None
    # histogram:120 beats keepalive:600 on both, but fronts are per family: keepalive:600 stays on its own.
    assert by["keepalive:600"].on_front_p75
    assert by["keepalive:600"].on_front_wait
    assert not by["keepalive:3600"].on_front_p75
    assert by["keepalive:3600"].on_front_wait
    assert by["histogram:120"].on_front_p75
    assert not by["histogram:240"].on_front_p75
    assert not by["histogram:240"].on_front_wait
    assert [p.label for p in result.front("keepalive", "p75")] == ["keepalive:60", "keepalive:600"]


def test_table_lists_every_label_with_its_front_marks() -> None:
    table = sweep(_run, POLICIES).table()
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert set(rows) == set(label_grid(POLICIES))
    assert rows["keepalive:3600"].rstrip().endswith("-*")
    assert rows["histogram:240"].rstrip().endswith("--")
    assert rows["histogram:120"].rstrip().endswith("**")


def test_matched_reads_a_familys_front_at_each_other_point() -> None:
    by = {m.label: m for m in sweep(_run, POLICIES).matched("keepalive")}
    assert set(by) == {"reactive", "histogram:120", "histogram:240"}
    assert by["histogram:120"].against == "p75"
    assert by["histogram:120"].value == 0.3
    # Linear between keepalive:60 (100 GB-min, p75 0.8) and keepalive:600 (600 GB-min, 0.4).
    assert by["histogram:120"].family_value == pytest.approx(0.8 - 0.4 * 150 / 500)
    assert by["histogram:240"].family_value == pytest.approx(0.8 - 0.4 * 350 / 500)
    # No keep-alive gets below p75 0.4, and none holds less than keepalive:60's 100 GB-min.
    assert by["histogram:120"].family_idle_gb_minutes is None
    assert by["reactive"].family_value is None
    # keepalive:60 is already below reactive's p75 of 1.0.
    assert by["reactive"].family_idle_gb_minutes == 100.0


def test_matched_against_the_wait_reads_the_front_of_the_share_waiting_over_5_s() -> None:
    by = {m.label: m for m in sweep(_run, POLICIES).matched("keepalive", "wait")}
    # keepalive:3600 is on this front (less waiting for more memory), off the p75 one.
    assert [p.label for p in sweep(_run, POLICIES).front("keepalive", "wait")][-1] == "keepalive:3600"
    assert by["histogram:120"].value == 0.4
    # Within histogram:120's 250 GB-min: between keepalive:60 (100, 0.5) and keepalive:600 (600, 0.3).
    assert by["histogram:120"].family_value == pytest.approx(0.5 - 0.2 * 150 / 500)
    # For its share of 0.4, halfway from 0.5 to 0.3: 350 GB-min.
    assert by["histogram:120"].family_idle_gb_minutes == pytest.approx(350.0)
    # Beyond keepalive:600, toward keepalive:3600's (3600 GB-min, 0.1).
    assert sweep(_run, POLICIES).front_within("keepalive", 2100.0, "wait") == pytest.approx(0.2)


def test_a_budget_beyond_the_front_gets_its_best_point_and_off_front_points_are_not_read() -> None:
    result = sweep(_run, POLICIES)
    assert result.front_within("keepalive", 1e9) == 0.4
    assert result.front_within("keepalive", 100.0) == 0.8
    # keepalive:3600 has the same p75 for more memory: off the p75 front, it would have answered 3600.
    assert result.front_idle_for("keepalive", 0.4) == 600.0


def test_matched_table_says_where_the_front_does_not_reach() -> None:
    header, *lines = sweep(_run, POLICIES).matched_table("keepalive").splitlines()
    rows = {line.split(": ")[0].strip(): line for line in lines}
    assert header.startswith("keepalive at each other point")
    assert list(rows) == ["reactive", "histogram:120", "histogram:240"]
    assert rows["reactive"].endswith("keepalive: p75 not reached, idle 100 (other 0)")
    assert rows["histogram:120"].endswith("keepalive: p75 0.680 (2.27 x), idle not reached")
    wait = sweep(_run, POLICIES).matched_table("keepalive", "wait").splitlines()
    assert wait[0].startswith("keepalive at each other point: share > 5 s within its idle memory")
    assert wait[2].endswith("keepalive: share > 5 s 44.00% (1.10 x), idle 350 (1.40 x)")


def test_a_front_against_an_unknown_measure_is_refused() -> None:
    with pytest.raises(ValueError, match="p75 or wait, not 'idle'"):
        sweep(_run, POLICIES).matched("keepalive", "idle")


def test_only_measures_some_point_is_above_zero_on_are_read() -> None:
    assert sweep(_run, POLICIES).measures() == ["p75", "wait"]
    nobody_waits = {label: {**m, "share_wait_over_5s": 0.0} for label, m in TABLE.items()}
    assert sweep(lambda labels: {k: nobody_waits[k] for k in labels}, POLICIES).measures() == ["p75"]


def test_png_is_written_and_is_a_valid_png(tmp_path: Path) -> None:
    import matplotlib.image

    path = sweep(_run, POLICIES).to_png(tmp_path / "out" / "pareto.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[1] > image.shape[0] > 100  # two panels side by side


def test_json_holds_every_point_and_its_metrics() -> None:
    doc = sweep(_run, POLICIES).to_json()
    assert [p["label"] for p in doc["points"]] == label_grid(POLICIES)
    assert doc["points"][1]["metrics"]["requests"] == 100


def test_a_label_the_run_left_out_is_an_error() -> None:
    with pytest.raises(KeyError, match="keepalive:600"):
        sweep(lambda labels: {k: TABLE[k] for k in labels if k != "keepalive:600"}, POLICIES)


def test_default_knobs_sweep_every_policy_kind() -> None:
    assert set(DEFAULT_KNOBS) == {"reactive", "keepalive", "histogram", "oracle", "prewarm"}
    assert "600" in DEFAULT_KNOBS["keepalive"]
    assert "240" in DEFAULT_KNOBS["histogram"]


# ------------------------------------------------------------------ the command's grid


def test_a_kind_sweeps_its_default_knobs_and_a_label_its_own() -> None:
    defaults = {"keepalive": ("60", "600"), "reactive": (), "histogram": ("240",)}
    assert parse_grid([], [], defaults) == {"keepalive": ("60", "600"), "reactive": (), "histogram": ("240",)}
    assert parse_grid(["keepalive", "histogram:120", "histogram:480"], [], defaults) == {
        "keepalive": ("60", "600"),
        "histogram": ("120", "480"),
    }


def test_knobs_replace_a_kinds_grid_and_name_it_enough_to_sweep_it() -> None:
    defaults = {"keepalive": ("60", "600"), "prewarm": ("0.01",)}
    assert parse_grid(["keepalive"], ["keepalive=30, 90", "prewarm=0,1"], defaults) == {
        "keepalive": ("30", "90"),
        "prewarm": ("0", "1"),
    }


@pytest.mark.parametrize("bad", ["keepalive", "=1,2", "keepalive="])
def test_a_malformed_knobs_option_is_invalid_input(bad: str) -> None:
    with pytest.raises(InvalidInput, match="--knobs"):
        parse_grid([], [bad], {})


# ------------------------------------------------------------------ the command, end to end


def _app() -> typer.Typer:
    """The command on an app of its own: the coordinator registers it as ``prewarm sim sweep``."""
    app = typer.Typer()

    @app.callback()
    def root(ctx: typer.Context) -> None:
        ctx.obj = load_settings()

    app.command("sweep")(sweep_command)
    return app


def test_sweep_command_draws_the_curves_and_writes_every_point(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    day0 = 1_704_067_200.0
    timer = day0 + 1800.0 * np.arange(3 * 48) + rng.uniform(-20, 20, 3 * 48)
    poisson = day0 + np.cumsum(rng.exponential(900.0, 3 * 96))
    trace = tmp_path / "trace.csv"
    pd.DataFrame(
        {"timestamp": np.r_[timer, poisson], "model": ["timer"] * timer.size + ["poisson"] * poisson.size}
    ).sort_values("timestamp").query(f"timestamp < {day0 + 3 * 86400}").to_csv(trace, index=False)
    png, out = tmp_path / "pareto.png", tmp_path / "sweep.json"
    args = ["sweep", "--trace", str(trace), "--train-days", "2", "--sim-hours", "12", "--unlimited"]
    args += ["--policy", "reactive", "--policy", "keepalive", "--knobs", "keepalive=60,600,3600"]
    args += ["--policy", "histogram:60", "--policy", "histogram:240", "--png", str(png), "--json", str(out)]
    args += ["--policy", "prewarm", "--knobs", "prewarm=0,0.01"]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    labels = ["reactive", "keepalive:60", "keepalive:600", "keepalive:3600", "histogram:60", "histogram:240"]
    labels += ["prewarm:0", "prewarm:0.01"]
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    doc = json.loads(out.read_text())
    assert [p["label"] for p in doc["points"]] == labels
    assert all(p["metrics"]["requests"] > 0 for p in doc["points"])
    for label in labels:
        assert label in result.output
    keepalive = {p["knob"]: p for p in doc["points"] if p["family"] == "keepalive"}
    # A longer keep-alive holds more memory and never makes more cold starts.
    assert keepalive["60"]["idle_gb_minutes"] < keepalive["600"]["idle_gb_minutes"]
    assert keepalive["600"]["idle_gb_minutes"] < keepalive["3600"]["idle_gb_minutes"]
    assert keepalive["3600"]["metrics"]["cold_starts"] <= keepalive["60"]["metrics"]["cold_starts"]
    # prewarm's front is read at every other point, on the terminal and in the JSON.
    assert [m["label"] for m in doc["matched"]] == labels[:-2]
    assert "prewarm at each other point" in result.output


def test_sweep_command_refuses_an_unknown_policy(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model\n1704067200,a\n")
    result = CliRunner().invoke(_app(), ["sweep", "--trace", str(trace), "--policy", "nonesuch"])
    assert result.exit_code != 0
    assert "nonesuch" in str(result.exception) + result.output


def test_sweep_command_refuses_a_plot_file_that_is_not_a_png_before_it_sweeps(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model\n1704067200,a\n")
    result = CliRunner().invoke(_app(), ["sweep", "--trace", str(trace), "--png", str(tmp_path / "p.txt")])
    assert result.exit_code != 0
    assert "name a .png file" in str(result.exception) + result.output
    assert not (tmp_path / "p.txt").exists()
