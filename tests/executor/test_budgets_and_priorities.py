"""Capacity is never over-committed, eviction never touches what is in use, demand pre-empts prefetch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_testkit import ExecutorFactory, make_model, s3_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor import FileStore
from executor._priority import LinkGate
from executor._stores import OnPiece
from executor._tier import Entry, NotAdmitted, TierCache
from models import Catalog
from prewarm import CapacityError, PrewarmError, Tier, lru_victims


def _entry(key: str, nbytes: int, recency: float, *, pins: int = 0, ready: bool = True) -> Entry[str, None]:
    return Entry(key, nbytes, loaded_at=recency, ready=ready, pins=pins)


def test_tier_entries_give_up_room_by_the_shared_lru_rule() -> None:
    # The executor's own entries, through the spine's rule that its tiers call.
    entries = [
        _entry("pinned-old", 10, 0.0, pins=1),
        _entry("loading", 10, 1.0, ready=False),
        _entry("old", 10, 2.0),
        _entry("new", 10, 3.0),
    ]
    assert lru_victims(entries, need=15, free=0) == ["old", "new"]
    assert lru_victims(entries, need=5, free=0) == ["old"]
    assert lru_victims(entries, need=5, free=5) == []
    assert lru_victims(entries, need=25, free=0) is None


def test_an_unused_prefetch_counts_as_used_at_its_hold_until_so_a_load_gives_up_older_copies_first() -> None:
    now = [0.0]
    tier: TierCache[str, None] = TierCache(Tier.L1, 30, clock=lambda: now[0], release=lambda k, v: None)
    tier.reserve("bet", 10, prefetched=True)
    tier.commit("bet")
    assert tier.hold("bet", 600.0)
    now[0] = 5.0
    tier.reserve("plain", 10, prefetched=True)  # a prefetch no order held: as used when loaded
    tier.commit("plain")
    now[0] = 9.0
    tier.reserve("used", 10)
    tier.commit("used")
    tier.lookup("used")
    now[0] = 10.0
    tier.reserve("request-1", 10)  # by load time alone the bet, loaded first, would go
    assert "plain" not in tier
    assert "bet" in tier
    assert "used" in tier
    tier.reserve("request-2", 10)
    assert "used" not in tier  # used at 9 s: older than the bet's 600 s
    assert "bet" in tier
    tier.lookup("bet")  # used now: an ordinary copy, last used at 10 s
    assert not tier.hold("bet", 900.0)
    tier.commit("request-1")
    tier.commit("request-2")
    now[0] = 11.0
    tier.lookup("request-1")
    tier.lookup("request-2")
    tier.reserve("request-3", 10)
    assert "bet" not in tier


def test_a_full_tier_asks_admission_with_each_victims_bytes_and_evicts_nothing_when_declined() -> None:
    tier: TierCache[str, None] = TierCache(Tier.L2, 100, clock=time.monotonic, release=lambda k, v: None)
    for key, nbytes in (("small", 20), ("large", 70)):
        tier.reserve(key, nbytes)
        tier.commit(key)
    asked: list[list[tuple[str, int]]] = []

    def decline(victims: list[tuple[str, int]]) -> bool:
        asked.append(victims)
        return False

    with pytest.raises(NotAdmitted):
        tier.reserve("new", 50, admit=decline)  # 10 bytes free: both must go
    assert asked == [[("small", 20), ("large", 70)]]
    assert tier.used == 90  # nothing evicted, nothing placed


@pytest.fixture(scope="module")
def many_models(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    directory = tmp_path_factory.mktemp("weights")
    # Three sizes, so budgets fragment and eviction has real choices.
    return Catalog(make_model(directory, f"p{i}", seed=i, layers=1 + i % 3) for i in range(6))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([Tier.L0, Tier.L1, Tier.L2]), st.booleans()),
        min_size=4,
        max_size=14,
    ),
    budget_models=st.integers(1, 3),
)
def test_concurrent_ensures_never_exceed_any_tier_budget(
    many_models: Catalog,
    make_executor: ExecutorFactory,
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[tuple[int, Tier, bool]],
    budget_models: int,
) -> None:
    largest = max(spec.size_bytes for spec in many_models)
    budget = budget_models * largest + 8192
    executor = make_executor(
        many_models,
        cache_dir=tmp_path_factory.mktemp("cache"),
        l0_budget=float(budget),
        l1_budget_bytes=budget,
        l2_budget_bytes=budget + largest,
    )
    caches = (executor.l0.cache, executor.l1.cache, executor.l2.cache)
    peak = {cache.tier: 0 for cache in caches}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for cache in caches:
                peak[cache.tier] = max(peak[cache.tier], cache.used)
                held = sum(e.nbytes for e in cache.snapshot())
                assert held <= cache.capacity
            time.sleep(0.001)

    errors: list[BaseException] = []

    def call(index: int, tier: Tier, demand: bool) -> None:
        try:
            executor.ensure(f"p{index}", tier, demand=demand)
        except CapacityError:
            pass  # everything else was loading at that moment: refusing is allowed, over-committing not
        except PrewarmError as exc:
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=call, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()

    assert not errors
    for cache in caches:
        assert peak[cache.tier] <= cache.capacity
        assert cache.used == sum(e.nbytes for e in cache.snapshot())
    on_disk = sum(p.stat().st_size for p in (executor.l2.root / "objects").rglob("*") if p.is_file())
    assert on_disk <= executor.l2.cache.capacity


def test_demand_transfer_pauses_prefetch_on_the_same_link() -> None:
    gate = LinkGate("L2->L1")
    log: list[str] = []
    demand_started = threading.Event()
    demand_may_finish = threading.Event()

    def prefetch() -> None:
        with gate.transfer(lambda: False) as transfer:
            for i in range(50):
                transfer.checkpoint()
                log.append(f"p{i}")
                time.sleep(0.002)

    def demand() -> None:
        with gate.transfer(lambda: True):
            demand_started.set()
            demand_may_finish.wait()
            log.append("demand-done")

    p = threading.Thread(target=prefetch)
    p.start()
    while len(log) < 3:
        time.sleep(0.001)
    d = threading.Thread(target=demand)
    d.start()
    demand_started.wait()
    paused_at = len(log)
    time.sleep(0.05)
    assert len(log) <= paused_at + 1  # at most the chunk that had already passed its checkpoint
    demand_may_finish.set()
    d.join()
    p.join()
    assert log.index("demand-done") < len(log) - 1
    assert log[-1] == "p49"  # the prefetch resumed and finished


def test_a_link_counts_the_seconds_a_demand_transfer_was_on_it_and_no_others() -> None:
    now = [0.0]
    gate = LinkGate("L3->L2", clock=lambda: now[0])
    with gate.transfer(lambda: False):
        now[0] = 5.0  # a prefetch alone: the link is not busy with requests
    with gate.transfer(lambda: True), gate.transfer(lambda: True):
        now[0] = 8.0  # two demand transfers at once count once
        assert gate.busy_s() == 3.0
    now[0] = 20.0
    assert gate.busy_s() == 3.0


def test_prefetch_becomes_demand_when_a_request_waits_for_the_same_model() -> None:
    gate = LinkGate("L3->L2")
    wanted = threading.Event()
    blocked = threading.Event()
    with gate.transfer(lambda: True):  # some other model's demand occupies the link

        def prefetch() -> None:
            with gate.transfer(wanted.is_set) as transfer:
                transfer.checkpoint()
                blocked.set()

        t = threading.Thread(target=prefetch)
        t.start()
        time.sleep(0.1)
        assert not blocked.is_set()  # paused behind the other demand
        wanted.set()  # a request now waits for this very model
        t.join(timeout=2)
        assert blocked.is_set()


class _SlowStore(FileStore):
    """A FileStore whose every range takes a little time, so transfers overlap in a test."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        time.sleep(self.delay)
        super().read_range_into(uri, start, dest, on_piece)


def test_demand_load_finishes_before_a_prefetch_started_earlier(
    tmp_path: Path, make_executor: ExecutorFactory
) -> None:
    big = make_model(tmp_path / "w", "big", seed=1, layers=8)
    small = make_model(tmp_path / "w", "small", seed=2, layers=2)
    part = 64 * 1024
    executor = make_executor(
        Catalog([big, small]),
        s3=s3_settings(s3_part_bytes=part, s3_concurrency=4),
        stores={"file": _SlowStore(delay=0.05)},
    )
    finished: list[str] = []

    def load(model: str, demand: bool) -> None:
        executor.ensure(model, Tier.L1, demand=demand)
        finished.append(model)

    prefetch = threading.Thread(target=load, args=("big", False))
    prefetch.start()
    time.sleep(0.1)  # the prefetch is well under way
    assert finished == []  # ... and still running when the demand arrives
    demand = threading.Thread(target=load, args=("small", True))
    demand.start()
    prefetch.join()
    demand.join()
    assert finished == ["small", "big"]


def test_a_node_reports_the_models_it_is_loading_for_a_waiting_request_until_they_are_ready(
    tmp_path: Path, make_executor: ExecutorFactory
) -> None:
    big = make_model(tmp_path / "w", "big", seed=1, layers=8)
    small = make_model(tmp_path / "w", "small", seed=2, layers=8)
    executor = make_executor(
        Catalog([big, small]),
        s3=s3_settings(s3_part_bytes=64 * 1024, s3_concurrency=2),
        stores={"file": _SlowStore(delay=0.05)},
    )
    loads = [
        threading.Thread(target=executor.ensure, args=("big", Tier.L1), kwargs={"demand": True}),
        threading.Thread(target=executor.ensure, args=("small", Tier.L1), kwargs={"demand": False}),
    ]
    for t in loads:
        t.start()
    # Both loads take seconds on the slow store; wait for the demand one to begin, not a fixed time.
    deadline = time.monotonic() + 10
    while not (listed := executor.state().demand_loads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listed == ["big"]  # a prefetch is no request's load
    for t in loads:
        t.join()
    assert executor.state().demand_loads == []


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    before = threading.active_count()
    yield
    # Executors are closed by make_executor; nothing the tests start should outlive them.
    assert threading.active_count() <= before + 16
