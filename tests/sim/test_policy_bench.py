"""``prewarm bench policy``'s judgement: the issue's targets, read off each policy's metrics."""

from __future__ import annotations

import dataclasses

import pytest

from prewarm import ResidentModel, gpu_shards, load_settings
from scheduler import Cluster
from sim import PolicyBench, SimMetrics, judge, run_policy_bench, suite
from sim._bench import at_equal_memory, unlimited_bound
from sim._policies import build
from tests.conftest import CLUSTER_SHAPES

BASE = SimMetrics(
    policy="x",
    unlimited=False,
    requests=100,
    cold_starts=10,
    cold_start_rate=0.1,
    p75_model_cold_start_rate=0.2,
    share_wait_over_1s=0.1,
    share_wait_over_5s=0.1,
    wait_total_s=0.0,
    wait_mean_s=0.0,
    wait_p50_s=0.0,
    wait_p95_s=0.0,
    wait_p99_s=0.0,
    wait_max_s=0.0,
    idle_gb_minutes={"L0": 1000.0, "L1": 500.0, "L2": 0.0},
    prefetches=0,
    mispredictions=0,
    mispredicted_by={"order": 0, "displaced": 0, "end": 0},
    bytes_moved=0,
    bytes_moved_per_link={},
    gpu_seconds_loading=0.0,
    stable=True,
    offered_load=0.1,
    busiest_link="",
    served_from={},
    slow_from={},
    model_cold_start_rate={},
    queued_loads=0,
    failed_orders=0,
    orders=0,
    over_commit_bytes=0,
)


def _with(**changes: object) -> SimMetrics:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def case():  # type: ignore[no-untyped-def]
    return suite(["flash_crowd"])[0]


def test_unlimited_targets_compare_p75_with_the_histogram_and_memory_with_ten_minute_keepalive(case) -> None:  # type: ignore[no-untyped-def]
    results = {
        "histogram": _with(p75_model_cold_start_rate=0.2),
        "keepalive:600": _with(idle_gb_minutes={"L0": 1000.0}),
        "prewarm": _with(p75_model_cold_start_rate=0.1, idle_gb_minutes={"L0": 600.0}),
    }
    p75, memory = judge(case, "unlimited", results)
    assert p75.met
    assert p75.bound == pytest.approx(0.1)
    assert not memory.met
    assert memory.bound == pytest.approx(500.0)


def test_tight_targets_take_the_best_baseline_by_its_share_waiting_over_five_seconds(case) -> None:  # type: ignore[no-untyped-def]
    results = {
        "reactive": _with(share_wait_over_5s=0.3),
        "keepalive:600": _with(share_wait_over_5s=0.2),
        "histogram": _with(share_wait_over_5s=0.1, idle_gb_minutes={"L0": 100.0, "L1": 100.0}),
        "oracle": _with(share_wait_over_5s=0.04),
        "prewarm": _with(
            share_wait_over_5s=0.05,
            idle_gb_minutes={"L0": 150.0, "L1": 100.0},
            prefetches=8,
            mispredictions=2,
        ),
    }
    share, memory, oracle, mispredicted = judge(case, "tight", results)
    assert "histogram" in share.name
    assert share.met
    assert not memory.met
    assert memory.bound == pytest.approx(200.0)
    assert oracle.met
    assert oracle.bound == pytest.approx(0.06)
    assert mispredicted.met


def test_a_cluster_of_the_callers_is_judged_by_the_tight_targets_under_its_own_name(case) -> None:  # type: ignore[no-untyped-def]
    results = {
        "reactive": _with(share_wait_over_5s=0.2),
        "keepalive:600": _with(share_wait_over_5s=0.3),
        "histogram": _with(share_wait_over_5s=0.4),
        "oracle": _with(share_wait_over_5s=0.05),
        "prewarm": _with(share_wait_over_5s=0.08),
    }
    targets = judge(case, "nohost", results, kind="tight")
    assert [t.setting for t in targets] == ["nohost"] * 4
    assert [t.name for t in targets] == [t.name for t in judge(case, "tight", results)]
    assert targets[0].bound == pytest.approx(0.1)
    assert targets[0].met


def test_every_shipped_cluster_shape_loads_and_can_hold_every_model_of_the_suite() -> None:
    shapes = sorted(CLUSTER_SHAPES.glob("*.yaml"))
    assert [p.stem for p in shapes] == ["dgx", "mixed", "nohost", "thin"]
    largest = max(spec.size_bytes for c in suite() for spec in c.catalog)
    for path in shapes:
        cluster = Cluster.load(path)
        assert all(gpu_shards(largest, [g.memory_bytes for g in node.gpus]) for node in cluster.nodes), path


def test_a_setting_that_is_neither_the_suites_nor_a_given_cluster_is_refused_before_any_run(case) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown settings"):
        run_policy_bench([case], load_settings(), where=["tight", "nohost"])


def test_a_baseline_of_zero_is_met_only_by_zero(case) -> None:  # type: ignore[no-untyped-def]
    results = {"reactive": _with(cold_starts=0), "prewarm": _with(cold_starts=1)}
    (roomy,) = judge(case, "roomy", results)
    assert not roomy.met
    (roomy,) = judge(case, "roomy", {**results, "prewarm": _with(cold_starts=0)})
    assert roomy.met


def test_reports_built_without_validation_take_the_defaults_of_fields_left_out() -> None:
    resident = build(ResidentModel, model="m", version="1", bytes=3)
    assert resident.leases == 0
    assert resident.gpus == []
    assert build(ResidentModel, model="m", version="1", bytes=3).gpus is not resident.gpus
    with pytest.raises(TypeError, match="bytes"):
        build(ResidentModel, model="m", version="1")


def test_an_all_poisson_case_reports_whether_the_unlimited_targets_can_both_be_met(case) -> None:  # type: ignore[no-untyped-def]
    memoryless = suite(["memoryless"])[0]
    keep = {"L0": 400_000.0}
    results = {
        "histogram": _with(p75_model_cold_start_rate=0.444),
        "keepalive:600": _with(idle_gb_minutes=keep),
    }
    bound = unlimited_bound(memoryless, results)
    assert bound is not None
    assert bound.p75 == pytest.approx(0.222)
    assert bound.idle_allowed == pytest.approx(200_000.0)
    # 22 of the 29 models requested in the window must be resident 77.8 % of 2,880 minutes.
    assert bound.idle_needed > 500_000.0
    assert not bound.feasible
    roomier = unlimited_bound(memoryless, {**results, "keepalive:600": _with(idle_gb_minutes={"L0": 2e6})})
    assert roomier is not None
    assert roomier.feasible
    # Structure (here a flash crowd) is what a policy can use to do better: no bound is claimed.
    assert unlimited_bound(case, results) is None


def test_prewarm_run_at_several_prices_is_read_at_each_baselines_memory_and_p75() -> None:
    def at(idle: float, p75: float) -> SimMetrics:  # under --unlimited nobody waits
        return _with(idle_gb_minutes={"L0": idle}, p75_model_cold_start_rate=p75, share_wait_over_5s=0.0)

    bench = PolicyBench()
    bench.runs["c"] = {
        "unlimited": {
            "histogram": at(800.0, 0.4),
            "keepalive:600": at(400.0, 0.9),
            "prewarm:0.001": at(1000.0, 0.1),
            "prewarm:0.01": at(500.0, 0.3),
        },
        "tight": {"reactive": at(1.0, 1.0), "prewarm": at(1.0, 1.0)},  # one price: no front to read
    }
    assert list(bench.swept()) == [("c", "unlimited")]
    matched = {m["label"]: m for m in bench.to_json()["matched"]}
    assert {m["against"] for m in bench.to_json()["matched"]} == {"p75"}  # no wait front: nobody waited
    # At the histogram's 800 GB-min, 3/5 of the way from 0.3 at 500 to 0.1 at 1000.
    assert matched["histogram"]["family_value"] == pytest.approx(0.18)
    assert matched["histogram"]["family_idle_gb_minutes"] == 500.0
    assert matched["keepalive:600"]["family_value"] is None  # no price holds as little as 400 GB-min
    assert "c, unlimited: prewarm at each other point" in bench.table()


def test_on_a_cluster_prewarms_share_waiting_over_5_s_is_read_at_each_baselines_memory() -> None:
    def at(idle_l0: float, idle_l1: float, wait5: float) -> SimMetrics:
        return _with(idle_gb_minutes={"L0": idle_l0, "L1": idle_l1, "L2": 9e9}, share_wait_over_5s=wait5)

    bench = PolicyBench()
    bench.runs["c"] = {
        "tight": {
            "reactive": at(600.0, 400.0, 0.02),
            "prewarm": at(700.0, 400.0, 0.01),
            "prewarm:0.001": at(500.0, 300.0, 0.014),
        }
    }
    wait = {m["label"]: m for m in bench.to_json()["matched"] if m["against"] == "wait"}
    # At reactive's 1,000 GB-min of L0 + L1 (disk never counts): from 0.014 at 800 toward 0.01 at 1,100.
    assert wait["reactive"]["family_value"] == pytest.approx(0.014 - 0.004 * 200 / 300)
    assert wait["reactive"]["family_idle_gb_minutes"] == 800.0  # the leaner price already waits less
    assert "c, tight: prewarm at each other point: share > 5 s within its idle memory" in bench.table()


def _tight(reactive: SimMetrics, prewarm: SimMetrics, priced: SimMetrics) -> dict[str, SimMetrics]:
    """A tight run of every policy with prewarm at two prices: reactive waits least of the baselines."""
    return {
        "reactive": reactive,
        "keepalive:600": _on_cluster(800.0, 0.03),
        "histogram": _on_cluster(900.0, 0.04),
        "oracle": _on_cluster(700.0, 0.001),
        "prewarm": prewarm,
        "prewarm:0.001": priced,
    }


def _on_cluster(idle_l0: float, wait5: float) -> SimMetrics:
    return _with(idle_gb_minutes={"L0": idle_l0, "L1": 0.0}, share_wait_over_5s=wait5)


def test_the_tight_target_is_read_at_the_best_baselines_own_idle_memory_and_not_counted(case) -> None:  # type: ignore[no-untyped-def]
    results = _tight(_on_cluster(1000.0, 0.02), _on_cluster(1100.0, 0.008), _on_cluster(600.0, 0.012))
    reading = at_equal_memory(case, "tight", results)
    assert reading is not None
    assert reading.baseline == "reactive"  # the least share > 5 s, as the target picks it
    # At reactive's 1,000 GB-min: 4/5 of the way from 0.012 at 600 to 0.008 at 1,100.
    assert reading.share == pytest.approx(0.012 - 0.004 * 400 / 500)
    assert reading.met  # 0.0088 ≤ 0.5 × 0.02
    assert reading.idle_for_share == 600.0  # the leaner price already waits less than reactive
    # prewarm's own point holds more memory than reactive: the counted target is missed.
    assert not next(t for t in judge(case, "tight", results) if t.name.startswith("idle")).met

    bench = PolicyBench(equal_memory=[reading])
    assert bench.summary() == {}  # beside the targets, never in them
    assert bench.to_json()["equal_memory"][0]["met"] is True
    assert "at reactive's idle memory: prewarm's share > 5 s 0.880% = 0.44 × its 2.000%" in bench.table()
    assert (
        "at the best baseline's idle memory (not counted above): prewarm's share > 5 s ≤ 0.5 × on 1 of 1, "
        "below it on 1" in bench.table()
    )


def test_no_equal_memory_reading_without_prewarm_at_two_prices(case) -> None:  # type: ignore[no-untyped-def]
    results = {label: _with() for label in ("reactive", "keepalive:600", "histogram", "oracle", "prewarm")}
    assert at_equal_memory(case, "tight", results) is None


def test_a_front_that_holds_more_than_the_baseline_at_every_price_is_not_met(case) -> None:  # type: ignore[no-untyped-def]
    results = _tight(_on_cluster(500.0, 0.02), _on_cluster(1100.0, 0.001), _on_cluster(600.0, 0.002))
    reading = at_equal_memory(case, "tight", results)
    assert reading is not None
    assert reading.share is None
    assert not reading.met
    assert not reading.below
    assert "prewarm holds more than that at every price" in reading.line()
