"""A want (a model is wanted from ``t0`` to ``t1`` with probability ``p``) and a model's wants.

A full round has every forecast model's wants, a few dozen each (one per candidate window worth one),
and reads few of them: a candidate is looked for among them soonest first until one is worth acting on,
and a resident is valued by those of the coming window. So a forecast's wants are kept as the columns
its windows were valued into (``_Tail``) and made into ``_Want`` tuples only as far as a reader goes: at
10,000 models a round made 600,000 of them, and the cyclic garbage collector walked them all again.
"""

from __future__ import annotations

import array
import bisect
import functools
import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, overload

from prewarm import OrderReason

_INF = float("inf")


class _Want(NamedTuple):
    """A model is wanted from ``t0`` to ``t1`` with probability ``p``. (A tuple: a round makes tens of
    thousands, and a frozen dataclass took a third of the round to build them.)"""

    model: str
    p: float
    t0: float
    t1: float
    reason: OrderReason
    demand: bool
    key_time: float  # what the order id is bucketed by: stable across rounds for the same reason


_P, _T0 = operator.attrgetter("p"), operator.attrgetter("t0")


class _Columns(NamedTuple):
    """The tail wants (``_Tail``) of a batch of forecasts, row after row: in arrays of numbers, which
    the cyclic garbage collector does not walk, where lists of floats had it look at every one."""

    p: array.array[float]
    t0: array.array[float]
    t1: array.array[float]
    held: array.array[float]  # ``t1 - t0``, the float a want's fields give
    windows: array.array[int]
    begins: array.array[float]  # when the window begins (``t0`` is when its arrival is, no sooner)

    @classmethod
    def of(
        cls,
        p: Iterable[float],
        t0: Iterable[float],
        t1: Iterable[float],
        held: Iterable[float],
        windows: Iterable[int],
        begins: Iterable[float],
    ) -> _Columns:
        return cls(
            array.array("d", p),
            array.array("d", t0),
            array.array("d", t1),
            array.array("d", held),
            array.array("q", windows),
            array.array("d", begins),
        )


class _Tail:
    """The wants of a forecast's windows after the first, one per arrival, in window order: rows
    ``lo`` to ``hi`` of ``columns``, numbered from 0 here. Each is made into a ``_Want`` when first
    read and kept, as the windows are, between the rounds of a forecast bucket."""

    __slots__ = ("_by_time", "_made", "columns", "hi", "lo", "model")

    def __init__(self, model: str, columns: _Columns, lo: int, hi: int) -> None:
        self.model, self.columns, self.lo, self.hi = model, columns, lo, hi
        self._made: dict[int, _Want] = {}
        self._by_time: list[int] | None = None

    @classmethod
    def of(cls, model: str, wants: Sequence[_Want], windows: list[int], begins: list[float]) -> _Tail:
        """The rows of ``model``'s forecast ``wants``, of the windows ``windows`` (which begin at
        ``begins``)."""
        columns = _Columns.of(
            [w.p for w in wants],
            [w.t0 for w in wants],
            [w.t1 for w in wants],
            [w.t1 - w.t0 for w in wants],
            windows,
            begins,
        )
        return cls(model, columns, 0, len(wants))

    def __len__(self) -> int:
        return self.hi - self.lo

    def want(self, i: int) -> _Want:
        made = self._made.get(i)
        if made is None:
            k, columns = self.lo + i, self.columns
            t0 = columns.t0[k]
            made = self._made[i] = _new_want(
                (self.model, columns.p[k], t0, columns.t1[k], OrderReason.FORECAST, False, t0)
            )
        return made

    def t0(self, i: int) -> float:
        return self.columns.t0[self.lo + i]

    def cut(self, count: int) -> int:
        """How many rows are of the first ``count`` windows."""
        return bisect.bisect_left(self.columns.windows, count, self.lo, self.hi) - self.lo

    def find(self, t0: float, cut: int) -> int:
        """The first of the first ``cut`` rows whose want begins at ``t0``; -1: none."""
        try:
            return self.columns.t0.index(t0, self.lo, self.lo + cut) - self.lo
        except ValueError:
            return -1

    def extreme(
        self, column: array.array[float], cut: int, twin: int, pick: Callable[..., float]
    ) -> float | None:
        """``pick`` (max, min) of ``column`` over the first ``cut`` rows but ``twin``; None: no row."""
        lo = self.lo
        rows = column[lo : lo + cut]
        if twin >= 0:
            del rows[twin]
        return pick(rows) if rows else None

    def by_time(self) -> list[int]:
        """The rows by ``t0``, ties in window order (as a stable sort of the wants by ``t0``)."""
        if self._by_time is None:
            self._by_time = sorted(range(len(self)), key=self.columns.t0[self.lo : self.hi].__getitem__)
        return self._by_time


_new_want = functools.partial(tuple.__new__, _Want)
"""``_Want`` from a tuple of its fields, without the class's Python-level ``__new__``."""


class _ForecastWants:
    """A forecast's wants at one ``now``: the first window's (``head``: valued at ``now``; None: not
    worth one), then the first ``cut`` rows of ``tail`` but ``twin`` (-1: none), a later window that
    arrives when the head does and so adds nothing. Iterated, in that order."""

    __slots__ = ("cut", "head", "tail", "twin")

    def __init__(self, head: _Want | None, tail: _Tail, cut: int, twin: int) -> None:
        self.head, self.tail, self.cut, self.twin = head, tail, cut, twin

    def __len__(self) -> int:
        return (self.head is not None) + self.cut - (self.twin >= 0)

    def __iter__(self) -> Iterator[_Want]:
        if self.head is not None:
            yield self.head
        want, twin = self.tail.want, self.twin
        for i in range(self.cut):
            if i != twin:
                yield want(i)

    def max_p(self) -> float:
        tail = self.tail
        best = tail.extreme(tail.columns.p, self.cut, self.twin, max)
        if self.head is None:
            return -1.0 if best is None else best
        return self.head.p if best is None else max(self.head.p, best)

    def min_held(self) -> float:
        tail = self.tail
        least = tail.extreme(tail.columns.held, self.cut, self.twin, min)
        if self.head is None:
            return _INF if least is None else least
        held = self.head.t1 - self.head.t0
        return held if least is None else min(held, least)

    def by_time(self) -> Iterator[_Want]:
        """Soonest first, ties in the order iterated (the head first)."""
        head, tail, cut, twin = self.head, self.tail, self.cut, self.twin
        t0, want = tail.t0, tail.want
        for i in tail.by_time():
            if i >= cut or i == twin:
                continue
            if head is not None and t0(i) >= head.t0:
                yield head
                head = None
            yield want(i)
        if head is not None:
            yield head

    def chances_until(self, t: float) -> Iterator[tuple[float, float]]:
        """``_Wants.chances_until``'s of these."""
        head, tail = self.head, self.tail
        if head is not None and head.t0 <= t:
            yield head.p, head.t1 - head.t0
        lo, (p, t0, _, held, _, begins) = tail.lo, tail.columns
        twin = lo + self.twin if self.twin >= 0 else -1
        for k in range(lo, lo + self.cut):  # in window order: once a window begins after t, all do
            if begins[k] > t:
                return
            if t0[k] <= t and k != twin:
                yield p[k], held[k]


class _Wants(Sequence[_Want]):
    """One model's wants: ``listed`` (its hints' and waiting requests', and forecast wants made as a
    list), then ``forecast``'s. As a sequence, the list a round used to build; its readers ask for what
    they read (``by_time``, ``chances_until``, ``reach``), so that the forecast's are made only that far."""

    __slots__ = ("forecast", "listed")

    def __init__(self, listed: list[_Want], forecast: _ForecastWants | None = None) -> None:
        self.listed = listed
        self.forecast = forecast

    def __len__(self) -> int:
        return len(self.listed) + (len(self.forecast) if self.forecast is not None else 0)

    def __iter__(self) -> Iterator[_Want]:
        yield from self.listed
        if self.forecast is not None:
            yield from self.forecast

    @overload
    def __getitem__(self, index: int) -> _Want: ...
    @overload
    def __getitem__(self, index: slice) -> list[_Want]: ...
    def __getitem__(self, index: int | slice) -> _Want | list[_Want]:
        return list(self)[index]

    def __repr__(self) -> str:
        return f"_Wants({list(self)!r})"

    def listing(self, listed: list[_Want]) -> _Wants:
        """These wants with ``listed`` in place of the listed ones."""
        return _Wants(listed, self.forecast)

    def signalled(self, reason: OrderReason) -> bool:
        """Whether a want is for ``reason``, which is not ``FORECAST`` (a hint, a waiting request)."""
        return bool(self.listed) and any(w.reason is reason for w in self.listed)

    def reach(self) -> tuple[float, float]:
        """The likeliest want's ``p`` and the shortest want's ``t1 - t0``; there must be a want."""
        listed, forecast = self.listed, self.forecast
        p = max(map(_P, listed), default=-1.0)
        held = min((w.t1 - w.t0 for w in listed), default=_INF)
        if forecast is not None:
            p, held = max(p, forecast.max_p()), min(held, forecast.min_held())
        return p, held

    def by_time(self, *, demand_first: bool = False) -> Iterator[_Want]:
        """Soonest first, ties in the order iterated (as a stable sort by ``t0``); ``demand_first``:
        the waiting requests' wants before all others."""
        listed, forecast = self.listed, self.forecast
        if not listed:  # the common case: a forecast's wants alone
            return iter(()) if forecast is None else forecast.by_time()
        first: Iterable[_Want] = ()
        if demand_first:
            first = sorted((w for w in listed if w.demand), key=_T0)
            listed = [w for w in listed if not w.demand]
        rest: Iterable[_Want] = sorted(listed, key=_T0)
        if forecast is not None:
            rest = heapq.merge(rest, forecast.by_time(), key=_T0)
        return itertools.chain(first, rest)

    def demanded_by(self, t: float) -> bool:
        """Whether a waiting request's want begins by ``t``."""
        return bool(self.listed) and any(w.demand and w.t0 <= t for w in self.listed)

    def chances_until(self, t: float) -> list[tuple[float, float]]:
        """``p`` and ``t1 - t0`` of each want that begins by ``t``, in no particular order (read from the
        forecast's columns: a round asks this of every resident, and made most of its wants here)."""
        out = [(w.p, w.t1 - w.t0) for w in self.listed if w.t0 <= t]
        if self.forecast is not None:
            out.extend(self.forecast.chances_until(t))
        return out


NO_WANTS = _Wants([])


class _Reread(Iterable[_Want]):
    """An iterator's wants, made once and read again by each reader as far as it goes."""

    __slots__ = ("_it", "_seen")

    def __init__(self, wants: Iterator[_Want]) -> None:
        self._it = wants
        self._seen: list[_Want] = []

    def __iter__(self) -> Iterator[_Want]:
        seen, i = self._seen, 0
        while True:
            if i < len(seen):
                yield seen[i]
            else:
                want = next(self._it, None)
                if want is None:
                    return
                seen.append(want)
                yield want
            i += 1
