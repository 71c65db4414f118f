from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster import ModelForecast
from models import Catalog, ModelSpec
from prewarm import ExecutorState, Hint, InvalidInput, Order, OrderAction, Tier
from scheduler import Cluster, PlannerConfig
from sim import (
    KeepAlivePolicy,
    OraclePolicy,
    Policy,
    PolicyContext,
    PrewarmPolicy,
    ReactivePolicy,
    SimMetrics,
    make_policy,
    make_world,
    policy_kinds,
    register_policy,
    run_policies,
    simulate,
)
from sim._prewarm import UNLIMITED_MEMORY_PRICE

GB = 10**9
CUT = 1_704_412_800.0  # a Friday 00:00 UTC
HOUR = 3600.0


def _catalog(sizes: Mapping[str, int]) -> Catalog:
    return Catalog(
        ModelSpec(id=m, version="1", uri=f"s3://b/{m}.safetensors", size_bytes=s) for m, s in sizes.items()
    )


def _tight(disk: str = "0") -> Cluster:
    """One node of one 80 GB GPU and 100 GB of host memory; ``disk``: its disk cache (none by default)."""
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "n1",
                    "gpus": [{"memory_bytes": "80GB"}],
                    "host_cache_bytes": "100GB",
                    "disk_cache_bytes": disk,
                },
            ],
            "bandwidth": {"l3_bytes_per_s": "2GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )


def _events(requests: Sequence[tuple[float, str]]) -> pd.DataFrame:
    return pd.DataFrame({"timestamp": [t for t, _ in requests], "model": [m for _, m in requests]})


def _run(
    label: str | Policy,
    requests: Sequence[tuple[float, str]],
    catalog: Catalog,
    *,
    cluster: Cluster | None = None,
    unlimited: bool = False,
    end: float = CUT + 2 * HOUR,
    warmup_s: float = 4 * HOUR,
) -> SimMetrics:
    policy = make_policy(label) if isinstance(label, str) else label
    world = make_world(catalog, cluster, start=CUT, end=end, unlimited=unlimited)
    return simulate(policy, world, [t for t, _ in requests], [m for _, m in requests], warmup_s=warmup_s)


# ------------------------------------------------------------------ labels


def test_labels_build_the_policies_they_name() -> None:
    keepalive = make_policy("keepalive:90")
    assert isinstance(keepalive, KeepAlivePolicy)
    assert (keepalive.name, keepalive.ttl_s) == ("keepalive:90", 90.0)
    assert make_policy("keepalive").ttl_s == 600.0  # type: ignore[attr-defined]
    assert isinstance(make_policy("reactive"), ReactivePolicy)
    assert isinstance(make_policy("oracle"), OraclePolicy)
    assert isinstance(make_policy("prewarm"), PrewarmPolicy)
    assert {"reactive", "keepalive", "oracle", "prewarm"} <= set(policy_kinds())


@pytest.mark.parametrize("label", ["lru", "keepalive:soon", "keepalive:-5", "reactive:3", "keepalive:"])
def test_a_label_that_names_no_policy_is_invalid_input(label: str) -> None:
    with pytest.raises(InvalidInput):
        make_policy(label)


def test_a_registered_kind_is_built_from_its_label() -> None:
    register_policy("test-never", lambda label, knob, inputs: ReactivePolicy(label))
    policy = make_policy("test-never:7")
    assert policy.name == "test-never:7"


def test_prewarm_knob_sets_the_planners_memory_price() -> None:
    if "memory_price" in {f.name for f in dataclasses.fields(PlannerConfig)}:
        policy = make_policy("prewarm:0.01", planner=PlannerConfig())
        assert isinstance(policy, PrewarmPolicy)
        assert policy.config.memory_price == 0.01  # type: ignore[attr-defined]
    else:
        with pytest.raises(InvalidInput, match="memory_price"):
            make_policy("prewarm:0.01")


# ------------------------------------------------------------------ keep-alive against its closed form


def _closed_form(
    times: Mapping[str, list[float]], sizes: Mapping[str, int], ttl: float, start: float, end: float
) -> tuple[int, float]:
    """Cold starts and idle GB-minutes of fixed keep-alive, with unlimited memory and instant loads."""
    cold, idle = 0, 0.0
    for model, ts in times.items():
        ts = sorted(ts)
        for i, t in enumerate(ts):
            if start <= t < end and (i == 0 or t - ts[i - 1] > ttl):
                cold += 1
            gap = ts[i + 1] - t if i + 1 < len(ts) else np.inf
            held_until = t + min(gap, ttl)
            idle += sizes[model] * max(0.0, min(held_until, end) - max(t, start))
    return cold, idle / GB / 60


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-3 * 3600, 2 * 3600), st.sampled_from(["a", "b", "c"])),
        max_size=60,
    ),
    st.sampled_from([1, 60, 300, 600, 1800, 3600]),
)
def test_keepalive_under_unlimited_memory_matches_its_closed_form(
    offsets: list[tuple[int, str]], ttl: int
) -> None:
    sizes = {"a": 14 * GB, "b": 70 * GB, "c": 140 * GB}
    requests = [(CUT + dt, m) for dt, m in offsets]
    times: dict[str, list[float]] = {}
    for t, m in requests:
        times.setdefault(m, []).append(t)
    result = _run(f"keepalive:{ttl}", requests, _catalog(sizes), unlimited=True)
    cold, idle = _closed_form(times, sizes, ttl, CUT, CUT + 2 * HOUR)
    assert result.requests == sum(1 for t, _ in requests if CUT <= t < CUT + 2 * HOUR)
    assert result.cold_starts == cold
    # The unload is due a rounding step after t + TTL (a request at exactly t + TTL is warm).
    assert result.idle_gb_minutes["L0"] == pytest.approx(idle, rel=1e-6, abs=1e-4)
    assert set(result.idle_gb_minutes) == {"L0"}


def test_keepalive_keeps_one_timer_per_model_moved_on_by_each_request() -> None:
    # Requested every minute for an hour: resident the hour and ten minutes after it (the closed form),
    # unloaded by the timer its first request set, moved on when due (six times) and then carried out,
    # not by an order per request.
    requests = [(CUT + 60 * k, "m") for k in range(60)]
    result = _run("keepalive:600", requests, _catalog({"m": 14 * GB}), unlimited=True)
    cold, idle = _closed_form({"m": [t for t, _ in requests]}, {"m": 14 * GB}, 600, CUT, CUT + 2 * HOUR)
    assert (result.cold_starts, result.idle_gb_minutes["L0"]) == (cold, pytest.approx(idle, rel=1e-6))
    assert result.orders == 7


def test_the_histogram_keeps_one_timer_per_model_for_its_tail_unload() -> None:
    # Fewer than ten idle times, too few to trust: kept for the whole range (4 h) after each request.
    # Requested every six minutes for an hour from the cut: loaded once and held to the end of the 2-hour
    # window, by one order whose time each request moved on (it is not due before the window ends).
    requests = [(CUT + 360 * k, "m") for k in range(10)]
    result = _run("histogram", requests, _catalog({"m": 14 * GB}), unlimited=True)
    assert (result.cold_starts, result.orders) == (1, 1)
    assert result.idle_gb_minutes["L0"] == pytest.approx(14 * 120)


def test_a_timer_exactly_every_ttl_stays_warm_under_keepalive() -> None:
    requests = [(CUT + 600 * k, "timer") for k in range(-3, 12)]
    result = _run("keepalive:600", requests, _catalog({"timer": 14 * GB}), unlimited=True)
    assert result.cold_starts == 0


def _one_gpu(host: str) -> Cluster:
    """One node of one 80 GB GPU, ``host`` of host memory and a 2 TB disk."""
    return Cluster.from_data(
        {
            "nodes": [
                {
                    "name": "n1",
                    "gpus": [{"memory_bytes": "80GB"}],
                    "host_cache_bytes": host,
                    "disk_cache_bytes": "2TB",
                }
            ],
            "bandwidth": {"l3_bytes_per_s": "2GB/s", "l2_bytes_per_s": "7GB/s", "l1_bytes_per_s": "50GB/s"},
        }
    )


@pytest.mark.parametrize("host", ["100GB", "10GB", "0"])
def test_keepalive_unloads_after_its_ttl_where_host_memory_cannot_hold_the_model(host: str) -> None:
    # A demotion to host memory too small for the model fails: the copy stayed in GPU memory for good.
    requests = [(CUT + 3600 * k, "m") for k in range(3)]
    result = _run(
        "keepalive:600",
        requests,
        _catalog({"m": 40 * GB}),
        cluster=_one_gpu(host),
        end=CUT + 3 * HOUR,
        warmup_s=0,
    )
    assert (result.cold_starts, result.failed_orders) == (3, 0)
    assert result.idle_gb_minutes[Tier.L0] == pytest.approx(3 * 40 * 10, rel=0.05)  # 10 minutes after each


# ------------------------------------------------------------------ warm start at the cut


@pytest.mark.parametrize("unlimited", [True, False])
def test_a_model_used_a_minute_before_the_cut_is_warm_at_the_cut(unlimited: bool) -> None:
    catalog = _catalog({"m": 14 * GB})
    requests = [(CUT - 60, "m"), (CUT + 10, "m")]
    cluster = None if unlimited else _tight()
    warm = _run("keepalive:600", requests, catalog, cluster=cluster, unlimited=unlimited)
    assert (warm.requests, warm.cold_starts) == (1, 0)
    cold = _run("keepalive:600", requests, catalog, cluster=cluster, unlimited=unlimited, warmup_s=0)
    assert cold.cold_starts == 1


# ------------------------------------------------------------------ the oracle


def _random_trace(seed: int, models: Sequence[str], n: int, span: float) -> list[tuple[float, str]]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(models) + 1)
    picks = rng.choice(len(models), size=n, p=weights / weights.sum())
    times = np.sort(rng.uniform(CUT - HOUR, CUT + span, size=n))
    return [(float(t), models[int(k)]) for t, k in zip(times, picks, strict=True)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_oracle_never_has_more_cold_starts_than_reactive(seed: int) -> None:
    sizes = {"a": 14 * GB, "b": 28 * GB, "c": 40 * GB, "d": 16 * GB, "e": 70 * GB}
    catalog = _catalog(sizes)
    requests = _random_trace(seed, list(sizes), 300, 2 * HOUR)
    reactive = _run("reactive", requests, catalog, cluster=_tight())
    oracle = _run("oracle", requests, catalog, cluster=_tight())
    assert oracle.requests == reactive.requests
    assert oracle.cold_starts <= reactive.cold_starts
    assert oracle.cold_starts < reactive.cold_starts  # it is a bound worth having


def test_the_oracle_under_unlimited_memory_has_no_cold_start_and_no_idle_memory() -> None:
    sizes = {"a": 14 * GB, "b": 140 * GB}
    requests = _random_trace(3, list(sizes), 200, 2 * HOUR)
    result = _run("oracle", requests, _catalog(sizes), unlimited=True)
    assert result.requests > 0
    assert result.cold_starts == 0
    assert result.idle_gb_minutes["L0"] == pytest.approx(0.0, abs=1e-9)


# ------------------------------------------------------------------ prewarm under unlimited memory


class _Sent(PrewarmPolicy):
    """prewarm at the ``--unlimited`` price, keeping every order it sends."""

    def __init__(self, source: Callable[[float], dict[str, ModelForecast]]) -> None:
        super().__init__(PlannerConfig(), source, unlimited_price=UNLIMITED_MEMORY_PRICE)
        self.sent: list[Order] = []

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        orders = super().tick(now, reports, hints)
        self.sent.extend(orders)
        return orders


def test_prewarm_under_unlimited_memory_orders_only_the_one_tier_there_is() -> None:
    # A 28 GB model, used an hour before, is forecast at 30 % a minute around a request 30 minutes on.
    # The world keeps GPU memory only: a copy released to host memory or staged on disk there would be
    # gone, and the request cold. prewarm releases it and brings it back into GPU memory in time.
    request = CUT + 1800

    def source(now: float) -> dict[str, ModelForecast]:
        start = now // 60 * 60
        minutes = start + 60 * np.arange(240)
        p = np.where(np.abs(minutes - request) < 300, 0.3, 0.0005)
        return {"m": ModelForecast("m", start, 60, -np.log1p(-p), p, "test")}

    policy = _Sent(source)
    result = _run(policy, [(CUT - HOUR, "m"), (request, "m")], _catalog({"m": 28 * GB}), unlimited=True)
    assert {o.tier for o in policy.sent} == {Tier.L0}
    assert {o.action for o in policy.sent} == {OrderAction.EVICT, OrderAction.PREFETCH}
    assert (result.requests, result.cold_starts, result.prefetches) == (1, 0, 1)


# ------------------------------------------------------------------ the driver


class _Recorder(Policy):
    name = "recorder"

    def __init__(self) -> None:
        self.hints: list[tuple[float, Hint]] = []
        self.context: PolicyContext | None = None

    def prepare(self, ctx: PolicyContext) -> None:
        self.context = ctx

    def tick(self, now: float, reports: Mapping[str, ExecutorState], hints: Sequence[Hint]) -> list[Order]:
        self.hints.extend((now, h) for h in hints)
        return []


def test_hints_reach_the_policy_at_the_first_tick_after_they_are_received() -> None:
    recorder = _Recorder()
    hint = Hint(model="m", ttl_s=600, received_at=CUT + 90)
    world = make_world(_catalog({"m": 14 * GB}), None, start=CUT, end=CUT + HOUR, unlimited=True)
    simulate(recorder, world, [CUT + 100], ["m"], hints=[hint], warmup_s=0)
    assert recorder.hints == [(CUT + 120, hint)]


def test_only_a_clairvoyant_policy_is_told_the_future() -> None:
    recorder = _Recorder()
    world = make_world(_catalog({"m": 14 * GB}), None, start=CUT, end=CUT + HOUR, unlimited=True)
    simulate(recorder, world, [CUT - 100, CUT + 100], ["m", "m"])
    assert recorder.context is not None
    assert recorder.context.future is None
    assert recorder.context.history[0].tolist() == [CUT - 100]


class _Observed:
    """A forecast source that also learns from what the platform serves."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def __call__(self, now: float) -> dict[str, object]:
        return {}

    def observe(self, model: str, at: float) -> None:
        self.seen.append((model, at))


def test_prewarm_tells_its_forecast_source_of_every_request_served() -> None:
    source = _Observed()
    policy = PrewarmPolicy(PlannerConfig(), source)  # type: ignore[arg-type]
    requests = [(CUT - 120, "m"), (CUT + 30, "m"), (CUT + 90, "m")]
    _run(policy, requests, _catalog({"m": 14 * GB}), unlimited=True)
    assert source.seen == [("m", t) for t, _ in requests]


def test_run_policies_keys_results_by_label_and_gives_each_its_own_forecast_source() -> None:
    source = _Observed()
    requests = [(CUT + 60 * k, "m") for k in range(5)]
    results = run_policies(
        _events(requests),
        _catalog({"m": 14 * GB}),
        None,
        ["reactive", "keepalive:60", "prewarm"],
        start=CUT,
        end=CUT + HOUR,
        forecasts=source,  # type: ignore[arg-type]
        unlimited=True,
    )
    assert list(results) == ["reactive", "keepalive:60", "prewarm"]
    assert all(r.requests == 5 for r in results.values())
    assert source.seen == []  # the prewarm run observed a copy


def test_every_policy_reports_a_window_without_requests_as_none_served() -> None:
    # The oracle split the window's requests by model, and a window without any had crashed it.
    results = run_policies(
        _events([(CUT - 600, "m")]),
        _catalog({"m": 14 * GB}),
        None,
        ["reactive", "keepalive:60", "histogram", "oracle"],
        start=CUT,
        end=CUT + HOUR,
        unlimited=True,
    )
    assert {label: r.requests for label, r in results.items()} == {
        "reactive": 0,
        "keepalive:60": 0,
        "histogram": 0,
        "oracle": 0,
    }


def test_prewarm_gets_each_hint_as_sent_and_none_whose_window_ended_before_the_replay() -> None:
    # A hint of the training days ended long before the replay begins: sent at the first tick as if new,
    # it was planned (and judged) as a fresh one. A hint in the window keeps the time it was sent, not
    # the tick that passed it on.
    stale = Hint(model="old", ttl_s=600.0, source="page", received_at=CUT - 2 * 86400)
    fresh = Hint(model="new", ttl_s=600.0, source="page", received_at=CUT + 61)
    policy = PrewarmPolicy(PlannerConfig(), None)
    world = make_world(
        _catalog({"old": 14 * GB, "new": 14 * GB}), _tight("1TB"), start=CUT, end=CUT + 600, unlimited=False
    )
    simulate(policy, world, [CUT + 300], ["new"], hints=[stale, fresh])
    assert {o.model for o in policy.core.recent_orders()} == {"new"}
    assert [(h.model, h.received_at) for h in policy.core.hints()] == [("new", CUT + 61)]
