"""The bundle's forecasts conditioned on what the platform has seen since training: ``LiveForecasts``.

A trained bundle knows each model's week; between retrains it is blind to three things the planner
needs for the long tail, and ``LiveForecasts`` adds them from the requests it is shown (``observe``):

1. **When, from the time since the last request.** Where the bundle's ``idle`` profile found idle-time
   structure (``forecaster._idle``: a timer, sessions, a job whose gaps the week table blurs), the
   chance of a request in each minute of the horizon is the modulated renewal hazard at the model's
   idle time then, given no request since ``now``: so the chance of any request between ``now`` and
   any later time is exact under the model, which is what the planner and the eviction ask. The
   expected counts are the process's marginal ones (requests following requests inside the horizon
   included). Memoryless models keep the bundle's calibrated rate (with its active/idle factor for
   the first minutes, as ``predict(recent=...)``, where the profile found that it helps).
2. **Recent arrivals.** A flash crowd or a deprecation changes a model's rate after training. Over the
   last 10, 30, 120 and 480 minutes (never before ``since``, the first time every request is
   observed) the active minutes seen are compared with those the forecast expected, minute by minute
   as it gives them (after the idle time then, or in the state then: a burst the active factor
   expects is no news); the longest window that agrees with every shorter one (within two standard
   deviations: so a crowd that just began or just ended is not averaged with hours of something
   else) sets the model's level: its
   chance per minute becomes ``L·p(t) + r`` with ``L = (observed + 1) / (expected + 1)`` and ``r``
   the rest of the observed minutes spread evenly (a model the bundle thought silent). Unless some
   window's count is ``level_z`` (Anscombe) standard deviations from its expectation nothing
   changes, so a Poisson model keeps its calibrated rate.
3. **Models the bundle has never seen** get ``recent_rate_forecasts`` from their observed requests.

``observe`` is O(1) (an append); ``__call__`` drains what was observed and is vectorised over models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from forecaster._bundle import ForecasterBundle
from forecaster._calendar import WEEK_MIN
from forecaster._history import History
from forecaster._idle import H_MAX, TAU_MAX, IdleProfile, fit_idle_profile
from forecaster._recent_rate import recent_rate_forecasts
from forecaster._types import ModelForecast, forecasts_of

__all__ = ["LiveForecasts"]

_LEVEL_PRIOR = 1.0
_AGREE_Z = 2.0
"""A shorter window agrees with a longer one's level within this many standard deviations."""


class LiveForecasts:
    """Forecasts for every bundle model, and every model observed since, conditioned on observations.

    ``history`` (optional) is the training span, to fit the idle-time profile of a bundle that has none
    (``fit_bundle`` fits it); ``since`` the time from which every request is passed to ``observe``
    (default: the end of training). ``horizon_s`` defaults to the bundle's.
    """

    def __init__(
        self,
        bundle: ForecasterBundle,
        *,
        history: History | None = None,
        since: float | None = None,
        horizon_s: int | None = None,
        recent_minutes: int = 60,
        level_windows: Sequence[int] = (10, 30, 120, 480),
        level_z: float = 3.0,
    ) -> None:
        self.bundle = bundle
        self.since = float(bundle.trained_until if since is None else since)
        self.horizon_s = int(bundle.horizon_s if horizon_s is None else horizon_s)
        self.recent_minutes = int(recent_minutes)
        self.level_windows = tuple(sorted(int(w) for w in level_windows))
        self.level_z = float(level_z)
        profile = fit_idle_profile(history, bundle) if history is not None else bundle.idle
        profile = profile or IdleProfile.empty(bundle.models)
        models = bundle.models
        self._models = models
        self._index = {m: i for i, m in enumerate(models)}
        at = [profile.index.get(m, -1) for m in models]
        rows = np.array([a for a in at if a >= 0], dtype=np.int64)
        mine = np.array([i for i, a in enumerate(at) if a >= 0], dtype=np.int64)
        last_minute = np.full(len(models), -np.inf)
        prior = np.full(len(models), np.inf)
        self._state = np.ones(len(models), dtype=bool)
        if rows.size:
            last_minute[mine] = np.nan_to_num(profile.last_minute[rows], nan=-np.inf)
            prior[mine] = profile.prior[rows]
            self._state[mine] = profile.state[rows]
        # The middle of the minute of the last request in training: a time in seconds like observe's.
        self._last_t = 60.0 * last_minute + 30.0
        self._structured = np.flatnonzero(np.isfinite(prior))
        g = np.ones((len(models), profile.edges.size))
        if rows.size:
            g[mine] = profile.g[rows]
        self._g = g[self._structured]
        self._lookup = profile.lookup
        week = 60.0 * np.arange(WEEK_MIN)
        structured_models = [models[i] for i in self._structured]
        lam_week = bundle.rates(week, structured_models) if structured_models else np.zeros((0, WEEK_MIN))
        scale_s = bundle.scales(structured_models) if structured_models else np.zeros(0)
        # Mean chance of a request per minute over the week, where the renewal kernel is evaluated.
        self._mean_p = np.maximum(-np.expm1(-scale_s[:, None] * lam_week).mean(axis=1), 1e-9)
        self._kernels: dict[int, npt.NDArray[np.float64]] = {}
        self._scale = bundle.scales()
        self._scale_active = bundle.scales(state="active")
        self._scale_idle = bundle.scales(state="idle")
        self._families = [
            c.family + ("+idle" if np.isfinite(p) else "") for c, p in zip(bundle.choices, prior, strict=True)
        ]
        self._pending_rows: list[int] = []
        self._pending_times: list[float] = []
        self._unseen: dict[str, list[float]] = {}
        self._log_t = np.zeros(0)
        self._log_i = np.zeros(0, dtype=np.int64)
        # Last request of each model among what the log no longer holds (training included).
        self._last_dropped = last_minute.copy()

    @property
    def models(self) -> list[str]:
        """The bundle's models followed by the unseen ones observed in the last ``recent_minutes``."""
        return self._models + [m for m in self._unseen if m not in self._index]

    def observe(self, model: str, at: float) -> None:
        """Record one request of ``model`` at ``at`` (epoch seconds). Any model name is accepted."""
        i = self._index.get(model)
        if i is None:
            self._unseen.setdefault(model, []).append(float(at))
        else:
            self._pending_rows.append(i)
            self._pending_times.append(float(at))

    def __call__(self, now: float, models: Sequence[str] | None = None) -> dict[str, ModelForecast]:
        """Forecasts from ``now`` over the horizon, by model (``models``: only those, where known)."""
        m_now = math.floor(now / 60.0)
        self._drain(now)
        level, extra = self._levels(m_now)
        b = self.bundle.bucket_s
        per = b // 60
        buckets = max(1, math.ceil(self.horizon_s / b))
        start = math.floor(now / b) * b
        offset = m_now - start // 60
        minutes = buckets * per - offset
        stamps = 60.0 * (m_now + np.arange(minutes))
        lam = self.bundle.rates(stamps)
        p_any, expected = self._minutes(now, m_now, lam, level, extra)
        if offset:  # minutes of the current bucket that are over: nothing more can happen in them
            pad = np.zeros((len(self._models), offset))
            p_any, expected = np.hstack([pad, p_any]), np.hstack([pad, expected])
        shape = (len(self._models), buckets, per)
        p_bucket = -np.expm1(np.log1p(-np.minimum(p_any, H_MAX)).reshape(shape).sum(axis=2))
        e_bucket = expected.reshape(shape).sum(axis=2)
        wanted = None if models is None else set(models)
        # A crowd or a deprecation changes how often the model is used at all, not only in the horizon.
        daily = level * self.bundle.daily_requests() + extra * 1440.0
        out = forecasts_of(self._models, float(start), b, e_bucket, p_bucket, self._families, daily)
        if wanted is not None:
            out = {m: f for m, f in out.items() if m in wanted}
        unseen = {m: self._recent_counts(ts, m_now) for m, ts in self._unseen.items()}
        for m, fc in recent_rate_forecasts(unseen, now, bucket_s=b, horizon_s=buckets * b).items():
            if wanted is None or m in wanted:
                out.setdefault(m, fc)
        return out

    # -- observations ------------------------------------------------------------------------------

    def _drain(self, now: float) -> None:
        if self._pending_rows:
            rows = np.array(self._pending_rows, dtype=np.int64)
            times = np.array(self._pending_times, dtype=np.float64)
            self._pending_rows, self._pending_times = [], []
            np.maximum.at(self._last_t, rows, times)
            self._log_t = np.concatenate([self._log_t, times])
            self._log_i = np.concatenate([self._log_i, rows])
        keep_from = 60.0 * (math.floor(now / 60.0) - max(self.level_windows, default=0) - 1)
        old = self._log_t < keep_from
        if old.any():
            np.maximum.at(self._last_dropped, self._log_i[old], np.floor(self._log_t[old] / 60.0))
            self._log_t, self._log_i = self._log_t[~old], self._log_i[~old]
        horizon = now - 60.0 * self.recent_minutes
        for model in list(self._unseen):
            recent = [t for t in self._unseen[model] if t > horizon]
            if recent:
                self._unseen[model] = recent
            else:
                del self._unseen[model]

    def _recent_counts(self, times: list[float], m_now: int) -> npt.NDArray[np.float64]:
        """Requests per minute of the last ``recent_minutes``, the current minute last."""
        offsets = np.floor(np.asarray(times) / 60.0).astype(np.int64) - (m_now - self.recent_minutes + 1)
        offsets = offsets[(offsets >= 0) & (offsets < self.recent_minutes)]
        return np.bincount(offsets, minlength=self.recent_minutes).astype(np.float64)

    # -- recent level ------------------------------------------------------------------------------

    def _levels(self, m_now: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per model the factor ``L`` and the added chance per minute ``r`` of its recent level."""
        n = len(self._models)
        level, extra = np.ones(n), np.zeros(n)
        first = max(m_now - max(self.level_windows, default=0), math.ceil(self.since / 60.0))
        span = m_now - first
        if span <= 0 or n == 0:
            return level, extra
        minute = np.floor(self._log_t / 60.0).astype(np.int64)
        inside = (minute >= first) & (minute < m_now)
        active = np.zeros((n, span), dtype=bool)
        active[self._log_i[inside], minute[inside] - first] = True
        lam = self.bundle.rates(60.0 * (first + np.arange(span)))
        p = -np.expm1(-self._scale[:, None] * lam)
        before = self._last_dropped.copy()
        earlier = minute < first
        np.maximum.at(before, self._log_i[earlier], minute[earlier].astype(np.float64))
        # What came is weighed against what the live forecast expected, minute by minute: for a model
        # whose chance follows its state (a request in the last ``state_minutes``: the bundle's active
        # factor, else its idle one) the chance its state gave, so that a burst the active factor
        # already expects is not read as a new level too (it was counted twice: a model with a request
        # minutes ago was forecast sure of another for the whole horizon, on an on/off trace 0.5 came).
        stated = self._state.copy()
        stated[self._structured] = False
        if stated.any():
            recent = _idle_minutes(active[stated], before[stated], first) <= self.bundle.state_minutes
            active_p = -np.expm1(-self._scale_active[stated, None] * lam[stated])
            idle_p = -np.expm1(-self._scale_idle[stated, None] * lam[stated])
            p[stated] = np.where(recent, active_p, idle_p)
        if self._structured.size:
            s = self._structured
            p[s] = self._hazard_path(_idle_minutes(active[s], before[s], first), p[s])
        # Counts over the last w minutes for every window, newest first.
        obs = np.cumsum(active[:, ::-1], axis=1)
        exp = np.cumsum(p[:, ::-1], axis=1)
        windows = [w for w in self.level_windows if w <= span] or [span]
        o = np.stack([obs[:, w - 1] for w in windows], axis=1).astype(np.float64)
        e = np.stack([exp[:, w - 1] for w in windows], axis=1)
        width = np.asarray(windows, dtype=np.float64)
        lv = (o + _LEVEL_PRIOR) / (e + _LEVEL_PRIOR)
        rv = np.maximum(o - lv * e, 0.0) / width
        z = np.abs(_anscombe(o, e))
        changed = (z >= self.level_z).any(axis=1)
        chosen = np.zeros(n, dtype=np.int64)
        for k in range(1, len(windows)):
            # Window k stands if every shorter window's count agrees with the level it estimates.
            agree = np.ones(n, dtype=bool)
            for j in range(k):
                predicted = lv[:, k] * e[:, j] + rv[:, k] * width[j]
                agree &= np.abs(_anscombe(o[:, j], predicted)) < _AGREE_Z
            chosen = np.where(agree, k, chosen)
        pick = np.arange(n), chosen
        level = np.where(changed, lv[pick], 1.0)
        extra = np.where(changed, rv[pick], 0.0)
        return level, extra

    def _hazard_path(
        self, tau: npt.NDArray[np.float64], p: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """The one-minute-ahead chance the idle-time model gave each past minute, ``tau`` minutes after
        the request before it, for structured rows."""
        known = np.isfinite(tau)
        bins = self._lookup[np.clip(np.nan_to_num(tau, posinf=TAU_MAX), 0, TAU_MAX).astype(np.int64)]
        factor = np.take_along_axis(self._g, bins, axis=1)
        return np.asarray(np.where(known, np.minimum(p * factor, H_MAX), p), dtype=np.float64)

    # -- the horizon -------------------------------------------------------------------------------

    def _minutes(
        self,
        now: float,
        m_now: int,
        lam: npt.NDArray[np.float64],
        level: npt.NDArray[np.float64],
        extra: npt.NDArray[np.float64],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """P(a request) and expected requests in each minute from ``m_now`` on, ``(models, minutes)``.

        For a structured model P is the chance of a request in the minute given none since ``now`` (the
        renewal hazard), so that the chance of any request from ``now`` to any later time is exact.
        """
        minutes = lam.shape[1]
        bundle = self.bundle
        # Memoryless rows: the bundle's factor; for those where it won on the profile's validation day
        # its active/idle one for the first minutes, as predict(recent=...). Structured rows: the
        # unconditional one (the idle-time factor already says what recent activity means).
        recent = (now - self._last_t) < 60.0 * bundle.state_minutes
        early = min(minutes, max(0, math.ceil((now + bundle.state_horizon_s) / 60.0) - m_now))
        scale = np.broadcast_to(self._scale[:, None], lam.shape).copy()
        state_scale = np.where(recent, self._scale_active, self._scale_idle)
        scale[:, :early] = np.where(self._state, state_scale, self._scale)[:, None]
        s = self._structured
        base = -np.expm1(-scale * lam)
        p = np.minimum(level[:, None] * base + extra[:, None], H_MAX)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_active = np.where(base > 1e-12, lam / base, 1.0)  # requests per minute with any
        expected = p * np.maximum(per_active, 1.0)
        if s.size:
            last = np.floor(self._last_t[s] / 60.0)
            p[s], marginal = self._renewal(p[s], m_now - last)
            expected[s] = marginal * np.maximum(per_active[s], 1.0)
        return p, expected

    def _renewal(
        self, p: npt.NDArray[np.float64], tau0: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The hazard and the marginal P(request) per minute from idle time ``tau0``.

        The hazard (P of a request in minute ``k`` given none since ``now``) is exact under the model:
        the idle-time factor at ``tau0 + k`` times that minute's seasonal chance. The marginal adds what
        follows a request inside the horizon: the model's renewal density at its mean chance
        (``_kernel``) scaled by the minute's chance over that mean, ``marginal[k] = first[k] + (p[k] /
        p̄) · sum_j first[j] u[k - j]`` with ``first`` the chance that the first request comes in
        minute ``k``: one causal convolution per model, done with FFTs for all at once. For a
        memoryless model (``g = 1``) both are exactly ``p``.
        """
        minutes = p.shape[1]
        known = np.isfinite(tau0)
        taus = np.where(known, tau0, 0.0)[:, None] + np.arange(minutes)[None, :]
        bins = self._lookup[np.clip(taus, 0, TAU_MAX).astype(np.int64)]
        factor = np.where(known[:, None], np.take_along_axis(self._g, bins, axis=1), 1.0)
        hazard = np.minimum(p * factor, H_MAX)
        survive = np.cumprod(1.0 - hazard, axis=1)
        first = hazard.copy()
        first[:, 1:] *= survive[:, :-1]
        current = known & (tau0 <= 0)  # a request already in this minute: it opens the horizon
        opened = first[current]
        opened[:, 0] = 1.0
        opened[:, 1:] = 0.0
        first[current] = opened
        kernel = self._kernel(minutes)
        size = kernel.shape[1]
        after = np.fft.irfft(
            np.fft.rfft(first, size, axis=1) * np.fft.rfft(kernel, size, axis=1), size, axis=1
        )
        marginal = first + p / self._mean_p[:, None] * np.maximum(after[:, :minutes], 0.0)
        marginal[current, 0] = hazard[current, 0]
        return hazard, np.asarray(np.clip(marginal, 0.0, H_MAX), dtype=np.float64)

    def _kernel(self, minutes: int) -> npt.NDArray[np.float64]:
        """Renewal density ``u[d]`` (a request ``d`` minutes after one, ``u[0] = 0``) at the mean chance,
        zero-padded to an FFT size of at least twice ``minutes``; computed once per horizon length."""
        cached = self._kernels.get(minutes)
        if cached is not None:
            return cached
        rows = self._g.shape[0]
        lags = np.arange(1, minutes)
        hazard = np.minimum(
            self._mean_p[:, None] * self._g[:, self._lookup[np.minimum(lags, TAU_MAX)]], H_MAX
        )
        passage = np.zeros((rows, minutes))
        passage[:, 1:] = hazard * np.concatenate(
            [np.ones((rows, 1)), np.cumprod(1.0 - hazard, axis=1)[:, :-1]], 1
        )
        u = np.zeros((rows, minutes))
        for d in range(1, minutes):  # u = F + F * u, term by term
            u[:, d] = passage[:, d] + np.einsum("ij,ij->i", passage[:, 1:d], u[:, d - 1 : 0 : -1])
        size = 1 << max(1, (2 * minutes - 1).bit_length())
        padded = np.zeros((rows, size))
        padded[:, :minutes] = u
        self._kernels[minutes] = padded
        return padded


def _idle_minutes(
    active: npt.NDArray[np.bool_], before: npt.NDArray[np.float64], first: int
) -> npt.NDArray[np.float64]:
    """Per model and past minute (``first`` on, ``active`` marking those with a request), the minutes
    since the last request before it (``before``: the last minute with one before ``first``; inf where
    none is known)."""
    steps = np.arange(active.shape[1])
    run = np.maximum.accumulate(np.where(active, steps, -1), axis=1)
    previous = np.concatenate([np.full((active.shape[0], 1), -1), run[:, :-1]], axis=1)
    last = np.where(previous >= 0, first + previous, before[:, None])
    return np.asarray((first + steps)[None, :] - last, dtype=np.float64)


def _anscombe(
    observed: npt.NDArray[np.float64], expected: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """How many standard deviations a Poisson count is from its expectation (variance-stabilised)."""
    return np.asarray(2.0 * (np.sqrt(observed + 0.375) - np.sqrt(np.maximum(expected, 0.0) + 0.375)))
