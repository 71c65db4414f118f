"""The fitted forecaster the scheduler holds: per-model week tables, calibration, and versioned JSON.

``ForecasterBundle.predict(now, horizon_s)`` is one gather from a ``(models, 10080)`` float32 table plus a
reshape per bucket: forecasts for a thousand models over two hours take milliseconds. On disk a bundle is
a directory: ``bundle.json`` (layout version, settings it was trained with, models, summary) and
``params.jsonl`` (one versioned JSON object per model: family, its parameters, calibration, scores,
fallback reason) and, where it was fitted, ``idle.json`` (each model's idle-time profile, ``_idle``).
Loading recompiles the tables from the parameters (a bundle built from choices compiles them at its first
forecast); nothing is pickled.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from forecaster._calendar import WEEK_MIN, minute_index
from forecaster._codec import check_version
from forecaster._idle import IDLE_FILE, IdleProfile
from forecaster._select import Choice
from forecaster._types import ModelForecast, forecasts_of
from forecaster.families import FAMILIES, family
from prewarm import ForecastError

__all__ = ["BUNDLE_VERSION", "ForecasterBundle"]

BUNDLE_VERSION = 1
_KIND = "prewarm-forecaster"


@dataclass
class ForecasterBundle:
    """Fitted forecasts for a set of models. Build with ``from_choices`` or ``load``."""

    choices: list[Choice]
    trained_until: float
    bucket_s: int = 60
    horizon_s: int = 7200
    summary: dict[str, Any] = field(default_factory=dict)
    state_minutes: int = 10
    state_horizon_s: int = 1200
    idle: IdleProfile | None = None
    """Each model's idle-time structure and last request in training (``forecaster.LiveForecasts`` uses
    it); ``None`` for a bundle trained or saved without one."""
    _tables: npt.NDArray[np.float32] | None = field(init=False, repr=False)
    """The ``(models, 10080)`` week tables, built on first use (``compile``)."""
    _scale: npt.NDArray[np.float64] = field(init=False, repr=False)
    _scale_active: npt.NDArray[np.float64] = field(init=False, repr=False)
    _scale_idle: npt.NDArray[np.float64] = field(init=False, repr=False)
    _index: dict[str, int] = field(init=False, repr=False)
    _daily: npt.NDArray[np.float64] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.bucket_s % 60 or self.bucket_s <= 0:
            raise ForecastError(f"bucket_s must be a positive multiple of 60, got {self.bucket_s}")
        self._tables = None
        self._daily = None
        self._scale = np.array([c.scale for c in self.choices], dtype=np.float64)
        self._scale_active = np.array([_or(c.scale_active, c.scale) for c in self.choices], dtype=np.float64)
        self._scale_idle = np.array([_or(c.scale_idle, c.scale) for c in self.choices], dtype=np.float64)
        self._index = {c.model: i for i, c in enumerate(self.choices)}

    @property
    def compiled(self) -> bool:
        """Whether the week tables are built (by ``compile``, ``load`` or the first forecast)."""
        return self._tables is not None

    def compile(self) -> ForecasterBundle:
        """Build the week tables now (``load`` does, so a bad parameter fails there, not at a forecast).

        Otherwise the first forecast builds them: 40 kB a model, which a retrain's driver that only
        saves and logs the bundle never needs (each chunk's fits were compiled on its worker)."""
        self._week_tables()
        return self

    def _week_tables(self) -> npt.NDArray[np.float32]:
        if self._tables is not None:
            return self._tables
        tables = np.zeros((len(self.choices), WEEK_MIN), dtype=np.float32)
        for i, choice in enumerate(self.choices):
            try:
                week = family(choice.family).week(choice.params)
            except (KeyError, TypeError, ValueError, ForecastError) as exc:
                raise ForecastError(
                    f"{choice.model}: cannot compile {choice.family} parameters: {exc}"
                ) from exc
            tables[i] = np.nan_to_num(np.maximum(week, 0.0) * choice.level, nan=0.0, posinf=0.0)
        self._daily = tables.mean(axis=1, dtype=np.float64) * 1440.0
        self._tables = tables
        return tables

    @classmethod
    def from_choices(
        cls,
        choices: Sequence[Choice],
        *,
        trained_until: float,
        bucket_s: int = 60,
        horizon_s: int = 7200,
        state_minutes: int = 10,
    ) -> ForecasterBundle:
        return cls(
            list(choices),
            trained_until=trained_until,
            bucket_s=bucket_s,
            horizon_s=horizon_s,
            state_minutes=state_minutes,
        )

    @property
    def models(self) -> list[str]:
        return [c.model for c in self.choices]

    def family_counts(self) -> dict[str, int]:
        """How many models each family was chosen for, by family name."""
        return dict(sorted(Counter(c.family for c in self.choices).items()))

    def choice(self, model: str) -> Choice:
        return self.choices[self._index[model]]

    def rates(
        self, timestamps: npt.ArrayLike, models: Sequence[str] | None = None
    ) -> npt.NDArray[np.float64]:
        """Expected requests per minute at each minute timestamp, ``(models, len(timestamps))``."""
        rows = slice(None) if models is None else [self._index[m] for m in models]
        return self._week_tables()[rows][:, minute_index(timestamps)].astype(np.float64)

    def daily_requests(self) -> npt.NDArray[np.float64]:
        """Expected requests per day of each model, averaged over its week."""
        self._week_tables()
        assert self._daily is not None
        return self._daily

    def scales(
        self, models: Sequence[str] | None = None, state: str | None = None
    ) -> npt.NDArray[np.float64]:
        """Calibration factors: unconditional, or for ``state`` ``"active"`` / ``"idle"``."""
        source = {None: self._scale, "active": self._scale_active, "idle": self._scale_idle}[state]
        return source if models is None else source[[self._index[m] for m in models]]

    def predict(
        self, now: float, horizon_s: int | None = None, recent: Mapping[str, float] | None = None
    ) -> dict[str, ModelForecast]:
        """Forecasts for every model over the horizon from ``now`` floored to a whole bucket.

        ``expected`` sums the per-minute rates over each bucket; ``p_any = 1 - exp(-c·expected)`` with the
        model's calibration factor ``c`` from the backtest. ``recent`` (optional) maps models to their
        request count in the ``state_minutes`` before ``now``; for the buckets of the first
        ``state_horizon_s`` a model with recent requests then uses its "active" factor (sessions continue)
        and one without its "idle" factor. Models missing from ``recent`` keep the unconditional one.
        """
        horizon = self.horizon_s if horizon_s is None else int(horizon_s)
        buckets = max(1, math.ceil(horizon / self.bucket_s))
        per_bucket = self.bucket_s // 60
        start = math.floor(now / self.bucket_s) * self.bucket_s
        cells = minute_index(start + 60.0 * np.arange(buckets * per_bucket))
        expected = self._week_tables()[:, cells].astype(np.float64)
        expected = expected.reshape(len(self.choices), buckets, per_bucket).sum(axis=2)
        scale = np.broadcast_to(self._scale[:, None], expected.shape).copy()
        if recent:
            early = min(buckets, max(0, math.ceil((now + self.state_horizon_s - start) / self.bucket_s)))
            state = self._scale.copy()
            for model, count in recent.items():
                i = self._index.get(model)
                if i is not None:
                    state[i] = self._scale_active[i] if count > 0 else self._scale_idle[i]
            scale[:, :early] = state[:, None]
        p_any = 1.0 - np.exp(-scale * expected)
        families = [c.family for c in self.choices]
        return forecasts_of(
            self.models, float(start), self.bucket_s, expected, p_any, families, self.daily_requests()
        )

    # -- persistence -------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``bundle.json`` and ``params.jsonl`` into ``directory`` (created if needed)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        header = {
            "version": BUNDLE_VERSION,
            "kind": _KIND,
            "trained_until": self.trained_until,
            "bucket_s": self.bucket_s,
            "horizon_s": self.horizon_s,
            "state_minutes": self.state_minutes,
            "state_horizon_s": self.state_horizon_s,
            "models": self.models,
            "families": {a: f.version for a, f in FAMILIES.items()},
            "summary": self.summary,
        }
        lines = [
            json.dumps(
                {
                    "version": BUNDLE_VERSION,
                    "model": c.model,
                    "family": c.family,
                    "family_version": family(c.family).version,
                    "scale": c.scale,
                    "scale_active": c.scale_active,
                    "scale_idle": c.scale_idle,
                    "level": c.level,
                    "params": c.params,
                    "scores": c.scores,
                    "reason": c.reason,
                },
                allow_nan=False,
            )
            for c in self.choices
        ]
        (path / "params.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""))
        (path / "bundle.json").write_text(json.dumps(header, indent=2, default=_jsonable))
        if self.idle is not None:
            self.idle.save(path)
        else:
            (path / IDLE_FILE).unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> ForecasterBundle:
        """Read a bundle written by ``save``; ``ForecastError`` for anything missing, malformed or newer."""
        path = Path(directory)
        try:
            header = json.loads((path / "bundle.json").read_text())
            raw_lines = (path / "params.jsonl").read_text().splitlines()
        except (OSError, json.JSONDecodeError) as exc:
            raise ForecastError(f"{path}: not a forecaster bundle: {exc}") from exc
        if header.get("kind") != _KIND:
            raise ForecastError(f"{path}: bundle.json is not a {_KIND} bundle")
        check_version(header, BUNDLE_VERSION, f"{path}/bundle.json")
        choices: list[Choice] = []
        for number, line in enumerate(raw_lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ForecastError(f"{path}/params.jsonl line {number}: {exc}") from exc
            check_version(entry, BUNDLE_VERSION, f"{path}/params.jsonl line {number}")
            fam = FAMILIES.get(entry.get("family", ""))
            if fam is None or entry.get("family_version") != fam.version:
                raise ForecastError(
                    f"{path}/params.jsonl line {number}: family {entry.get('family')!r} "
                    f"version {entry.get('family_version')!r} is not known to this code"
                )
            choices.append(
                Choice(
                    model=entry["model"],
                    family=entry["family"],
                    params=entry["params"],
                    scale=float(entry["scale"]),
                    level=float(entry.get("level", 1.0)),
                    scale_active=_float_or_none(entry.get("scale_active")),
                    scale_idle=_float_or_none(entry.get("scale_idle")),
                    scores=dict(entry.get("scores") or {}),
                    reason=entry.get("reason"),
                )
            )
        bundle = cls(
            choices,
            trained_until=float(header["trained_until"]),
            bucket_s=int(header["bucket_s"]),
            horizon_s=int(header["horizon_s"]),
            state_minutes=int(header.get("state_minutes", 10)),
            state_horizon_s=int(header.get("state_horizon_s", 1200)),
        )
        bundle.summary = dict(header.get("summary") or {})
        bundle.idle = IdleProfile.load(path)
        return bundle.compile()


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
