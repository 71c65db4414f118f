"""A hint source is trusted as far as its hints have come true."""

from __future__ import annotations

import pytest
from scheduler_builders import GB, NOW, catalog, cluster, hint, report, resident, spec

from prewarm import DEMAND_SOURCE, Order, Tier
from scheduler import PlannerConfig, SchedulerCore
from scheduler._trust import HintTrust

CONFIG = PlannerConfig()
CAP = {Tier.L0: 80 * GB, Tier.L1: 200 * GB, Tier.L2: 2000 * GB}


def test_a_hint_whose_model_is_asked_for_within_its_window_came_true_and_one_that_lapses_did_not() -> None:
    trust = HintTrust(prior=4.0, skip_source=DEMAND_SOURCE)
    trust.hinted(hint("chat", ttl_s=600.0, source="web"))
    trust.hinted(hint("chat", ttl_s=600.0, source="web", at=NOW + 1000))
    assert trust.used("chat", NOW + 120) == {"web"}  # inside the first hint's window only
    assert trust.judge(NOW + 1200) == set()  # the second is still open
    assert trust.judge(NOW + 1700) == {"web"}  # and then lapsed, its model not asked for
    assert trust.share("web") == 0.5
    # The source's record shrunk toward full trust by four hints' worth, (1 + 4) / (2 + 4), and the
    # model's toward the source's by as much.
    assert trust.trust("web", "chat") == pytest.approx((1 + 4 * 5 / 6) / (2 + 4))


def test_a_source_is_trusted_at_its_word_until_its_hints_say_otherwise_and_requests_are_not_judged() -> None:
    trust = HintTrust(prior=4.0, skip_source=DEMAND_SOURCE)
    assert trust.trust("web", "chat") == 1.0
    trust.hinted(hint("chat", source=DEMAND_SOURCE))
    assert trust.judge(NOW + 10_000) == set()
    for i in range(8):
        trust.hinted(hint("chat", ttl_s=60.0, source="web", at=NOW + 100 * i))
    trust.judge(NOW + 10_000)
    assert trust.trust("web", "chat") == pytest.approx((0 + 4 * (4 / 12)) / (8 + 4))
    # A model the source has not hinted before starts from the source's record, not from full trust.
    assert trust.trust("web", "other") == pytest.approx(4 / 12)
    assert trust.trust("app", "chat") == 1.0
    assert trust.share("app") is None
    [scaled] = trust.scaled([hint("other", source="web", confidence=0.9)])
    assert scaled.confidence == pytest.approx(0.9 * 4 / 12)


def test_a_source_whose_hints_never_came_true_no_longer_gets_a_copy_in_memory_for_its_next_hint() -> None:
    # Over two hours each of "app"'s ten hints for "chat" was followed by a node reporting it used a
    # minute later; "web" announced it ten times, each time after that use, and no request came. The core
    # learns both from what it sees. "web"'s next hint stages "chat" on disk at most; "app"'s, and a new
    # source's, bring it into memory.
    cat = catalog(spec("chat", 20 * GB))

    def next_hint_goes_to(source: str) -> set[Tier]:
        clock, out = [NOW - 7200], list[Order]()
        core = SchedulerCore(
            catalog=cat,
            cluster=cluster("a"),
            config=PlannerConfig(),
            dispatch=out.extend,
            clock=lambda: clock[0],
        )
        for i in range(10):
            at = clock[0] = NOW - 7200 + 600 * i
            core.add_hint(hint("chat", ttl_s=300.0, source="app", at=at))
            used = resident("chat", 20 * GB, loaded_at=at, last_used=at + 60)
            clock[0] = at + 120
            core.observe(report("a", {t: [used] for t in CAP}, capacity=CAP, at=clock[0]))
            clock[0] = at + 200  # "web" announces it once it has gone unused: nothing comes in 300 s
            core.add_hint(hint("chat", ttl_s=300.0, source="web", at=clock[0]))
        clock[0] = NOW
        core.observe(report("a", {}, capacity=CAP))
        core.replan()
        return {o.tier for o in core.add_hint(hint("chat", ttl_s=300.0, source=source, at=NOW))[1]}

    assert next_hint_goes_to("web") <= {Tier.L2}
    assert next_hint_goes_to("app") & {Tier.L0, Tier.L1}
    assert next_hint_goes_to("new") & {Tier.L0, Tier.L1}


def test_a_flood_of_hints_keeps_at_most_max_open_waiting_to_be_judged() -> None:
    trust = HintTrust(max_open=2)
    for ttl in (300.0, 100.0, 200.0):
        trust.hinted(hint("chat", ttl_s=ttl, source="web"))
    trust.judge(NOW + 1000)
    # The hint that expired first was dropped unjudged: two judged, not three.
    assert trust.share("web") == 0.0
    assert trust.trust("web", "chat") == pytest.approx((0 + 4 * 4 / 6) / (2 + 4))


def test_a_sources_hints_are_planned_for_when_they_have_come_true() -> None:
    # Ten hints from "page", each followed by a request 60-150 s later: its next hint with a 30-minute
    # window is planned for 70-150 s after it is sent (the 10th to 90th percentile), not for half an
    # hour. A hint whose own window lies outside that keeps its own, and so does a new source's.
    trust = HintTrust(skip_source=DEMAND_SOURCE)
    for i in range(10):
        sent = NOW + 1000 * i
        trust.hinted(hint("chat", ttl_s=1800.0, source="page", at=sent))
        trust.used("chat", sent + 60 + 10 * i)
    assert trust.window("page") == (70.0, 150.0)
    [narrowed, late, other] = trust.scaled(
        [
            hint("chat", ttl_s=1800.0, source="page", at=NOW + 20_000),
            hint("chat", eta_s=600.0, ttl_s=600.0, source="page", at=NOW + 20_000),
            hint("chat", ttl_s=1800.0, source="app", at=NOW + 20_000),
        ]
    )
    assert (narrowed.eta_s, narrowed.ttl_s, narrowed.confidence) == (70.0, 80.0, 1.0)
    assert (late.eta_s, late.ttl_s) == (600.0, 600.0)
    assert (other.eta_s, other.ttl_s) == (0.0, 1800.0)
    # Later hints that came true later move the window along.
    for i in range(10, 30):
        sent = NOW + 1000 * i
        trust.hinted(hint("chat", ttl_s=1800.0, source="page", at=sent))
        trust.used("chat", sent + 600)
    assert trust.window("page") == (90.0, 600.0)


def test_a_live_hint_scaled_round_after_round_is_one_copy_until_its_sources_trust_changes() -> None:
    # Every round scales every live hint: a flood of them was a pydantic copy each, each round.
    trust = HintTrust(prior=4.0, skip_source=DEMAND_SOURCE)
    trust.hinted(hint("chat", ttl_s=60.0, source="web"))
    trust.judge(NOW + 1000)  # lapsed: "web" is trusted less than its word
    live = [hint("chat", source="web", confidence=0.9, at=NOW + 2000 + i) for i in range(3)]
    first, again = trust.scaled(live), trust.scaled(live)
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert first[0].confidence == pytest.approx(0.9 * trust.trust("web", "chat"))
    trust.hinted(hint("chat", ttl_s=60.0, source="web", at=NOW + 3000))
    trust.used("chat", NOW + 3010)  # came true: the source's trust rose, and the copies follow it
    after = trust.scaled(live)
    assert after[0] is not first[0]
    assert after[0].confidence == pytest.approx(0.9 * trust.trust("web", "chat"))
    assert after[0].confidence > first[0].confidence
