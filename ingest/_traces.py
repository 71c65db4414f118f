"""Trace files → request events: the ``timestamp,model`` CSV, the Azure Functions 2019 per-minute layout
and the Azure Functions 2021 per-invocation layout.

Every reader returns the same frame, ``timestamp`` (float epoch seconds) and ``model`` (a valid model
id), sorted by time, so that replay, the simulator and the forecaster backtest never care where a trace
came from. A malformed row is an ``InvalidInput`` naming its line and column: a trace is a file a person
passed on the command line, and silently skipping rows would make every figure computed from it wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from prewarm import MAX_EPOCH_S, InvalidInput, abridged, not_epoch_seconds, validate_model_id

__all__ = [
    "AZURE2019_DEFAULT_START",
    "TRACE_FORMATS",
    "TraceFormat",
    "azure2019_minute_counts",
    "azure_model_id",
    "read_trace",
]

# Minute 1 of the Azure 2019 day files carries no date; a fixed Monday keeps replays reproducible and
# puts weekday-dependent patterns on a known weekday.
AZURE2019_DEFAULT_START = 1563148800.0  # 2019-07-15T00:00:00Z, a Monday
_AZURE_MINUTES = 1440
_AZURE_KEYS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
_AZURE2021_KEYS = ("app", "func", "end_timestamp", "duration")
_HEX = re.compile(r"[0-9a-fA-F]{16,}")

TraceFormat = Literal["requests", "azure2019", "azure2021"]
TRACE_FORMATS: tuple[TraceFormat, ...] = ("requests", "azure2019", "azure2021")


def azure_model_id(hash_function: str) -> str:
    """The prewarm model id of an Azure function: ``fn-`` and the first 16 hex digits of its hash."""
    return f"fn-{hash_function[:16].lower()}"


def read_trace(
    path: str | Path | Sequence[str | Path], fmt: TraceFormat = "requests", *, start: float | None = None
) -> pd.DataFrame:
    """Read a trace file into a frame of ``timestamp`` (float epoch s) and ``model`` (str), sorted by time.

    ``path`` may name several files, read as one trace: Azure 2019 day files (the dataset publishes one
    file a day) as consecutive days in the order given, the first at ``start``; files of the other
    formats one after the other, each read as if alone.

    ``fmt="requests"``: a CSV with header ``timestamp,model`` (timestamp epoch seconds or ISO-8601; other
    columns ignored); ``start`` is ignored. ``fmt="azure2019"``: the per-minute count layout; each
    minute's ``n`` invocations are spread evenly over that minute (at ``(i + 0.5) * 60 / n`` seconds) so
    that re-bucketing per minute gives back exactly the file's counts; ``start`` is the epoch of minute 1
    (default ``AZURE2019_DEFAULT_START``). ``fmt="azure2021"``: one row per invocation,
    ``app,func,end_timestamp,duration`` (seconds from the trace's start); a request arrives when its
    invocation started, ``end_timestamp - duration`` after ``start`` (default the same Monday: the file
    carries no date either). The model of an Azure function is ``azure_model_id`` of its hash.
    """
    if not isinstance(path, str | Path):
        paths = list(path)
        if not paths:
            raise InvalidInput("no trace file given", reason="missing")
        origin = AZURE2019_DEFAULT_START if start is None else float(start)
        day = 86_400.0 if fmt == "azure2019" else 0.0
        frames = [read_trace(p, fmt, start=origin + k * day) for k, p in enumerate(paths)]
        return _by_time(pd.concat(frames, ignore_index=True))
    path = Path(path)
    origin = AZURE2019_DEFAULT_START if start is None else float(start)
    if fmt == "requests":
        frame = _read_requests(path)
    elif fmt == "azure2019":
        frame = _azure_events(azure2019_minute_counts(path, start=origin))
    elif fmt == "azure2021":
        frame = _read_azure2021(path, origin)
    else:
        raise InvalidInput(
            f"unknown trace format {fmt!r}; expected one of {', '.join(TRACE_FORMATS)}", reason="format"
        )
    return _by_time(frame)


def _by_time(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` sorted by timestamp, rows of one instant in the order they came."""
    order = np.argsort(frame["timestamp"].to_numpy(), kind="stable")
    return frame.iloc[order].reset_index(drop=True)


def azure2019_minute_counts(
    path: str | Path | Sequence[str | Path], *, start: float | None = None
) -> pd.DataFrame:
    """Per-minute counts of an Azure 2019 invocations file: index epoch s of each minute, column per model.

    Rows whose ``HashFunction`` maps to the same model id are summed. Several files are consecutive days
    in the order given (as ``read_trace`` reads them), a model absent from a day counting 0 there. Tests
    compare the demand store's counts against this frame.
    """
    origin = AZURE2019_DEFAULT_START if start is None else float(start)
    if not isinstance(path, str | Path):
        days = [azure2019_minute_counts(p, start=origin + k * 86_400.0) for k, p in enumerate(path)]
        if not days:
            raise InvalidInput("no trace file given", reason="missing")
        joined = pd.concat(days).fillna(0).astype(np.int64)
        return joined[sorted(joined.columns)]
    path = Path(path)
    raw = _read_csv(path, dtype=str)
    missing = [key for key in _AZURE_KEYS if key not in raw.columns]
    if missing:
        raise InvalidInput(
            f"{path}: not an Azure 2019 invocations file, missing column(s) {missing}", reason="header"
        )
    minute_cols = [c for c in raw.columns if c.strip().isdigit()]
    minutes = sorted(int(c) for c in minute_cols)
    if not minutes or minutes[0] < 1 or minutes[-1] > _AZURE_MINUTES:
        raise InvalidInput(f"{path}: minute columns must be within 1..{_AZURE_MINUTES}", reason="header")
    ids: list[str] = []
    for row, value in enumerate(raw["HashFunction"].tolist()):
        if isinstance(value, str) and value.strip() == "HashFunction":
            raise InvalidInput(
                f"{path}: line {row + 2} is a header again: day files joined into one? Each file of the "
                "Azure 2019 layout is one day; give each day's file as a trace of its own, in order",
                reason="row",
            )
        ids.append(_function_id(path, row, "HashFunction", value))
    counts = np.zeros((len(raw), _AZURE_MINUTES), dtype=np.int64)
    # All minute columns at once (a 1440-column loop of string work took seconds on a 4-row file).
    # Empty cells mean "no invocations" in the published files; anything else must be a count.
    text = raw[minute_cols].fillna("").to_numpy(dtype=str)
    text = np.char.strip(text)
    text = np.where(text == "", "0", text)
    values = pd.to_numeric(pd.Series(text.ravel()), errors="coerce").to_numpy(np.float64).reshape(text.shape)
    bad = np.isnan(values) | (values < 0) | (values != np.floor(np.nan_to_num(values)))
    if bad.any():
        row, col = (int(v[0]) for v in np.nonzero(bad))
        raise InvalidInput(
            f"{path}: line {row + 2}, column {minute_cols[col]}: expected a non-negative integer count, "
            f"got {raw[minute_cols[col]].iloc[row]!r}",
            reason="row",
        )
    counts[:, [int(c) - 1 for c in minute_cols]] = values.astype(np.int64)
    index = (origin + 60.0 * np.arange(_AZURE_MINUTES)).astype(np.int64)
    frame = pd.DataFrame(counts.T, index=index, columns=ids)
    frame = frame.T.groupby(level=0, sort=True).sum().T
    frame.index.name = "timestamp"
    return frame


def _function_id(path: Path, row: int, column: str, value: object) -> str:
    """The model id of the Azure function hash in ``column`` of data row ``row``; a clear error if none."""
    if not isinstance(value, str) or not _HEX.fullmatch(value.strip()):
        raise InvalidInput(
            f"{path}: line {row + 2}, column {column}: expected a hex hash, got {value!r}", reason="row"
        )
    return azure_model_id(value.strip())


def _read_azure2021(path: Path, origin: float) -> pd.DataFrame:
    raw = _read_csv(path, dtype=str)
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [key for key in _AZURE2021_KEYS if key not in raw.columns]
    if missing:
        raise InvalidInput(
            f"{path}: not an Azure 2021 invocations file ('app,func,end_timestamp,duration'), missing "
            f"column(s) {missing}",
            reason="header",
        )
    seconds = {}
    for column in ("end_timestamp", "duration"):
        values = pd.to_numeric(raw[column], errors="coerce").to_numpy(dtype=np.float64)
        _refuse_first(
            path, ~np.isfinite(values) | (values < 0), raw[column], _expected("non-negative seconds")
        )
        seconds[column] = values
    funcs = raw["func"]
    # Each distinct hash checked once, at its first row: a function is invoked thousands of times.
    ids = {
        value: _function_id(path, int(row), "func", value) for row, value in funcs.drop_duplicates().items()
    }
    return pd.DataFrame(
        {
            "timestamp": origin + (seconds["end_timestamp"] - seconds["duration"]),
            "model": funcs.map(ids).to_numpy(dtype=object).astype(str),
        }
    )


def _refuse_first(
    path: Path, bad: npt.NDArray[np.bool_], cells: pd.Series, say: Callable[[Any], str]
) -> None:
    """``InvalidInput`` naming the first data row where ``bad`` holds: its line, the column ``cells`` is,
    and what ``say`` says of its cell."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InvalidInput(
            f"{path}: line {row + 2}, column {cells.name}: {say(cells.iloc[row])}", reason="row"
        )


def _expected(what: str) -> Callable[[Any], str]:
    return lambda cell: f"expected {what}, got {cell!r}"


def _azure_events(counts: pd.DataFrame) -> pd.DataFrame:
    """Spread each minute's count evenly over the minute, deterministically."""
    matrix = counts.to_numpy(dtype=np.int64)  # minutes × models
    minute_idx, model_idx = np.nonzero(matrix)
    n = matrix[minute_idx, model_idx]
    total = int(n.sum())
    rep_minute = np.repeat(minute_idx, n)
    rep_model = np.repeat(model_idx, n)
    rep_n = np.repeat(n, n)
    # Position of each event within its (minute, model) cell: 0..n-1.
    first = np.repeat(np.cumsum(n) - n, n)
    within = np.arange(total) - first
    base = counts.index.to_numpy(dtype=np.float64)[rep_minute]
    timestamps = base + (within + 0.5) * 60.0 / rep_n
    models = np.asarray(counts.columns, dtype=object)[rep_model]
    return pd.DataFrame({"timestamp": timestamps.astype(np.float64), "model": models.astype(str)})


def _read_csv(path: Path, **kwargs: object) -> pd.DataFrame:
    try:
        return pd.read_csv(path, skipinitialspace=True, keep_default_na=False, na_values=[""], **kwargs)
    except FileNotFoundError as exc:
        raise InvalidInput(f"{path}: no such trace file", reason="missing") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: not a readable CSV trace: {exc}", reason="csv") from exc


def _read_requests(path: Path) -> pd.DataFrame:
    raw = _read_csv(path, dtype=str)
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in ("timestamp", "model") if c not in raw.columns]
    if missing:
        for fmt, keys in (("azure2019", _AZURE_KEYS), ("azure2021", _AZURE2021_KEYS)):
            if all(key in raw.columns for key in keys):
                raise InvalidInput(
                    f"{path}: an Azure {fmt[5:]} invocations file, not a 'timestamp,model' trace: "
                    f"read it with --format {fmt}",
                    reason="header",
                )
        raise InvalidInput(
            f"{path}: header must contain 'timestamp,model', missing {missing} "
            f"(found {abridged(list(raw.columns), 8)})",
            reason="header",
        )
    stamps = raw["timestamp"].fillna("").astype(str).str.strip()
    numeric = pd.to_numeric(stamps, errors="coerce").to_numpy(dtype=np.float64, copy=True)
    needs_iso = np.isnan(numeric) & (stamps != "").to_numpy()
    if needs_iso.any():
        parsed = pd.to_datetime(stamps[needs_iso], utc=True, errors="coerce", format="ISO8601")
        ok = parsed.notna().to_numpy()
        epoch = np.full(len(parsed), np.nan)
        epoch[ok] = (parsed[ok] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=np.float64)
        numeric[needs_iso] = epoch
    _refuse_first(path, ~np.isfinite(numeric), raw["timestamp"], _expected("epoch seconds or ISO-8601"))
    _refuse_first(path, np.abs(numeric) >= MAX_EPOCH_S, raw["timestamp"], not_epoch_seconds)
    models = raw["model"].fillna("").astype(str).str.strip()
    # Validate each distinct id once; traces repeat a handful of ids millions of times.
    for model in pd.unique(models.to_numpy()):
        try:
            validate_model_id(model)
        except ValueError as exc:
            row = int(np.flatnonzero((models == model).to_numpy())[0])
            raise InvalidInput(f"{path}: line {row + 2}, column model: {exc}", reason="row") from exc
    return pd.DataFrame({"timestamp": numeric, "model": models.to_numpy(dtype=object).astype(str)})
