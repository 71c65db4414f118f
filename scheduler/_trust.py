"""How far each hint source's hints come true, learned from what the cluster then serves.

A hint says a model will be asked for within its window (``Hint.expected_at`` to ``Hint.expires_at``).
The scheduler sees whether it was: a request waiting for the model (a demand signal), or a copy of it
used (``ResidentModel.last_used`` in a node's report), inside the window. A product page that announces
sessions which never come would otherwise be trusted at its word forever, and every false alarm is a
prefetch that serves nothing.

A hint's chance is its own ``confidence`` times its source's record for the model: the hints that came
true out of those judged, shrunk toward the source's record over all its models, and that toward full
trust, each by ``prior`` hints' worth (a new source, or a model a source has not hinted before, is taken
at its word until its hints say otherwise). Demand signals are requests, not hints, and are not judged.
Each source's hints are also planned for *when* they have come true: once ``LAGS_NEEDED`` have, a hint's
window is narrowed to the 10th-90th percentile of the delays from hint to request, where that lies
inside the hint's own. A page that sends its hint with a 30-minute TTL a minute or two before its
session is then planned for those minutes, not taken as equally likely to be followed any time in half
an hour. The record lives in the scheduler's memory: a restarted scheduler starts trusting again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prewarm import Hint

__all__ = ["HintTrust"]

_INF = float("inf")
LAGS_KEPT = 64
"""Per source, the latest this many delays from a hint to the use that made it come true."""
LAGS_NEEDED = 8
"""A source's hints are planned for when they have come true once this many have."""
MIN_TTL_S = 30.0
"""A narrowed window is at least this long."""


@dataclass
class _Record:
    kept: float = 0.0
    judged: float = 0.0


class HintTrust:
    """Per (source, model) and per source, how many judged hints came true; ``scaled`` applies it."""

    def __init__(self, *, prior: float = 4.0, skip_source: str = "", max_open: int = 10_000) -> None:
        """``max_open``: hints waiting to be judged at most; past it the one that expires first is
        dropped unjudged (a flood of hints cannot grow memory without bound)."""
        self._prior = prior
        self._skip = skip_source
        self._max_open = max_open
        self._n_open = 0
        self._open: dict[str, list[Hint]] = {}  # model -> hints not judged yet
        self._next_over = _INF  # no open hint's window ends before this
        self._used: dict[str, float] = {}  # model -> latest use seen while a hint for it was open
        self._by_model: dict[tuple[str, str], _Record] = {}
        self._by_source: dict[str, _Record] = {}
        self._lags: dict[str, list[float]] = {}  # source -> seconds from hint to use, latest LAGS_KEPT
        self._windows: dict[str, tuple[float, float] | None] = {}  # ``window``, until a lag is added
        # ``scaled``'s copies by the id of the hint each scales, with the hint (so the id is not reused
        # while kept) and the trust and window it was scaled by: every round scales every live hint.
        self._scaled: dict[int, tuple[Hint, float, tuple[float, float] | None, Hint]] = {}

    def hinted(self, hint: Hint) -> None:
        """A hint to judge once its window is over (or once its model is used inside it)."""
        if hint.source == self._skip or hint.received_at is None:
            return
        if self._n_open >= self._max_open:
            model = min(self._open, key=lambda m: min(h.expires_at(0.0) for h in self._open[m]))
            first = min(self._open[model], key=lambda h: h.expires_at(0.0))
            self._remove(model, [first])
        self._open.setdefault(hint.model, []).append(hint)
        self._n_open += 1
        self._next_over = min(self._next_over, hint.expires_at(0.0))

    def used(self, model: str, at: float) -> set[str]:
        """``model`` was used (asked for) at ``at``: each open hint whose window holds ``at`` came true.
        Returns the sources whose record changed."""
        hints = self._open.get(model)
        if not hints or at <= self._used.get(model, -_INF):
            return set()  # most uses, a report's every copy each time: no hint waits, or seen already
        self._used[model] = at
        kept = [h for h in hints if _start(h) <= at <= h.expires_at(at)]
        if not kept:
            return set()
        self._remove(model, kept)
        for h in kept:
            self._judge(h, True)
            lags = self._lags.setdefault(h.source, [])
            lags.append(at - _start(h))
            del lags[: max(len(lags) - LAGS_KEPT, 0)]
            self._windows.pop(h.source, None)
        return {h.source for h in kept}

    def judge(self, now: float) -> set[str]:
        """Judge the hints whose window is over with no use seen in it as false alarms; the sources
        whose record changed."""
        changed: set[str] = set()
        if now <= self._next_over:
            return changed  # every round asks; a hint's window seldom ends in it
        for model in list(self._open):
            over = [h for h in self._open[model] if h.expires_at(now) < now]
            self._remove(model, over)
            for h in over:
                self._judge(h, False)
                changed.add(h.source)
        self._next_over = min((h.expires_at(now) for hs in self._open.values() for h in hs), default=_INF)
        return changed

    def trust(self, source: str, model: str) -> float:
        """The share of ``source``'s hints for ``model`` expected to come true (1: full trust)."""
        whole = self._by_source.get(source)
        if whole is None:
            return 1.0
        of_source = (whole.kept + self._prior) / (whole.judged + self._prior)
        mine = self._by_model.get((source, model), _Record())
        return (mine.kept + self._prior * of_source) / (mine.judged + self._prior)

    def window(self, source: str) -> tuple[float, float] | None:
        """When ``source``'s hints have come true, in seconds after the hint: the 10th and 90th
        percentiles of the latest lags, once ``LAGS_NEEDED`` are known (None before)."""
        if source in self._windows:
            return self._windows[source]  # every round asks for every live hint
        lags = self._lags.get(source)
        window = None
        if lags is not None and len(lags) >= LAGS_NEEDED:
            ordered = sorted(lags)
            window = ordered[len(ordered) // 10], ordered[(len(ordered) * 9) // 10]
        self._windows[source] = window
        return window

    def scaled(self, hints: Iterable[Hint]) -> list[Hint]:
        """``hints`` as the planner should take them: each one's confidence times its source's trust,
        and its window narrowed to when the source's hints have come true, where that lies inside it
        (the same hint where neither changes it). A hint scaled by the same trust and window as in the
        last call is the same copy: a flood of live hints costs a dict lookup each per round, not a
        copy each."""
        if not self._by_source:
            return list(hints)  # nothing judged yet: every source is taken at its word
        out = []
        kept: dict[int, tuple[Hint, float, tuple[float, float] | None, Hint]] = {}
        trusts: dict[tuple[str, str], float] = {}
        for h in hints:
            if h.source == self._skip:
                out.append(h)
                continue
            t = trusts.get((h.source, h.model))
            if t is None:
                t = trusts[h.source, h.model] = self.trust(h.source, h.model)
            learned = self.window(h.source)
            was = self._scaled.get(id(h))
            if was is not None and was[0] is h and was[1] == t and was[2] == learned:
                scaled = was[3]
            else:
                scaled = _scale(h, t, learned)
            kept[id(h)] = (h, t, learned, scaled)
            out.append(scaled)
        self._scaled = kept
        return out

    def share(self, source: str) -> float | None:
        """The share of ``source``'s judged hints that came true (None: none judged yet)."""
        record = self._by_source.get(source)
        return record.kept / record.judged if record is not None and record.judged else None

    def _remove(self, model: str, hints: list[Hint]) -> None:
        if not hints:
            return
        left = [h for h in self._open[model] if all(h is not g for g in hints)]
        self._n_open -= len(self._open[model]) - len(left)
        if left:
            self._open[model] = left
        else:
            del self._open[model]

    def _judge(self, hint: Hint, kept: bool) -> None:
        for record in (
            self._by_model.setdefault((hint.source, hint.model), _Record()),
            self._by_source.setdefault(hint.source, _Record()),
        ):
            record.judged += 1
            record.kept += kept


def _start(hint: Hint) -> float:
    """When a hint's window opens for judging: when it arrived (a request before the time it expects
    still shows the page meant it)."""
    return hint.received_at if hint.received_at is not None else -_INF


def _scale(h: Hint, trust: float, learned: tuple[float, float] | None) -> Hint:
    """``h`` with its confidence times ``trust`` and its window narrowed to ``learned`` (see ``scaled``)."""
    update: dict[str, float] = {}
    if trust < 1.0:
        update["confidence"] = max(h.confidence * trust, 1e-3)
    if learned is not None:
        begin, end = max(h.eta_s, learned[0]), min(h.eta_s + h.ttl_s, learned[1])
        if end > begin and (begin, end) != (h.eta_s, h.eta_s + h.ttl_s):
            update["eta_s"], update["ttl_s"] = begin, max(end - begin, MIN_TTL_S)
    return h.model_copy(update=update) if update else h
