"""Retraining chunk by chunk on an engine: the bundle and MLflow run of one process, series read lazily."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from typer.testing import CliRunner

from forecaster import Engine, History, SeriesChunk, SyntheticSeries, fit_bundle, retrain, selection_config
from forecaster._tracking import tracking_client
from ingest import generate
from prewarm import Settings, load_settings
from prewarm_cli import app

DAY = 86400
T = TypeVar("T")
R = TypeVar("R")


def _settings(tmp_path: Path, name: str, **forecast: Any) -> Settings:
    return load_settings(
        overrides={
            "data_dir": str(tmp_path),
            "history_days": 14,
            "holdout_days": 1.0,
            "mlflow_experiment": f"test-{name}",
            "registered_model": f"prewarm-forecaster-{name}",
            **forecast,
        }
    )


@pytest.fixture(scope="module")
def history() -> History:
    trace = generate(24, 5, seed=2)  # every pattern, three of each but launches and deprecations
    counts = trace.counts.astype(np.float64)
    # Two models launched in the last half day: too new to fit, they get priors from all the others.
    launched = np.zeros((2, counts.shape[1]))
    launched[:, -720:] = counts[0, -720:]  # a diurnal model's last half day
    return History(
        [*trace.models, "launched-a", "launched-b"], int(trace.start), np.vstack([counts, launched])
    )


def _choices(bundle: Any) -> list[tuple[Any, ...]]:
    fields = ("model", "family", "params", "scale", "scale_active", "scale_idle", "level", "scores", "reason")
    return [tuple(json.dumps(getattr(c, f), sort_keys=True) for f in fields) for c in bundle.choices]


def _same_idle(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True)
        for k in ("last_minute", "prior", "g", "state")
    )


def _run_record(uri: str, run_id: str | None, tmp: Path) -> tuple[dict[str, str], dict[str, float], bytes]:
    """A run's params, metrics but its timing, and its table of per-model scores."""
    assert run_id is not None
    client = tracking_client(uri)
    run = client.get_run(run_id)
    metrics = {k: v for k, v in run.data.metrics.items() if k != "agg.fit_seconds"}  # a timing
    tmp.mkdir()
    table = Path(client.download_artifacts(run_id, "backtest/per_model.csv", str(tmp))).read_bytes()
    return dict(run.data.params), metrics, table


def test_chunked_retrain_selects_and_fits_exactly_what_one_pass_over_all_series_does(
    tmp_path: Path, history: History
) -> None:
    whole = fit_bundle(history, selection_config(_settings(tmp_path, "whole")))
    one = retrain(_settings(tmp_path, "one", retrain_chunk_models=1000), history, history.end, track=False)
    small = retrain(_settings(tmp_path, "small", retrain_chunk_models=5), history, history.end, track=False)
    assert one.engine["chunks"] == 1
    assert small.engine["chunks"] == 6
    assert any(c.family == "prior" for c in whole.choices)  # a prior draws on every other chunk's models
    assert _choices(one.bundle) == _choices(whole) == _choices(small.bundle)
    assert _same_idle(one.bundle.idle, whole.idle)
    assert _same_idle(small.bundle.idle, whole.idle)
    assert one.report is not None
    assert small.report is not None
    assert small.report.per_model == one.report.per_model
    for key, value in one.report.aggregate.items():
        if key != "fit_seconds":
            # The reliability tallies add up per chunk: the calibration errors agree to rounding.
            assert small.report.aggregate[key] == pytest.approx(value, rel=1e-12), key


def test_two_dask_workers_give_the_single_process_bundle_and_mlflow_run(
    tmp_path: Path, history: History
) -> None:
    uri_one, uri_two = (tmp_path / "one").as_uri(), (tmp_path / "two").as_uri()
    single = retrain(
        _settings(tmp_path, "single", retrain_chunk_models=6), history, history.end, tracking_uri=uri_one
    )
    pooled = retrain(
        _settings(tmp_path, "pooled", retrain_chunk_models=6, retrain_workers=2),
        history,
        history.end,
        tracking_uri=uri_two,
    )
    assert single.engine["kind"] == "in-process"
    assert pooled.engine["kind"] == "local"
    assert pooled.engine["workers"] == 2
    assert pooled.engine["workers_peak_rss_bytes"] > 0
    assert _choices(pooled.bundle) == _choices(single.bundle)
    assert _same_idle(pooled.bundle.idle, single.bundle.idle)
    params_one, metrics_one, table_one = _run_record(uri_one, single.run_id, tmp_path / "one-run")
    params_two, metrics_two, table_two = _run_record(uri_two, pooled.run_id, tmp_path / "two-run")
    assert params_two == params_one
    assert metrics_two == metrics_one
    assert table_two == table_one
    assert table_one.count(b"\n") == 1 + len(history.models)  # every model's scores are compared


@dataclass
class _Watched:
    """A series source that counts how many of the chunks it handed out are alive at each read."""

    history: History
    reads: list[int] = field(default_factory=list)
    alive_at_read: list[int] = field(default_factory=list)
    _alive: list[weakref.ref[History]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.history.models)

    @property
    def start(self) -> int:
        return self.history.start

    @property
    def minutes(self) -> int:
        return self.history.minutes

    def chunk(self, rows: Any, *, portable: bool) -> SeriesChunk:
        source = self

        class _Lazy:
            def read(self) -> History:
                part = source.history.select(list(rows))
                source.alive_at_read.append(sum(ref() is not None for ref in source._alive))
                source._alive.append(weakref.ref(part))
                source.reads.append(len(part.models))
                return part

        return _Lazy()


def test_in_process_retrain_reads_each_chunk_when_it_fits_it_and_lets_it_go(
    tmp_path: Path, history: History
) -> None:
    source = _Watched(history)
    result = retrain(_settings(tmp_path, "lazy", retrain_chunk_models=4), source, history.end, track=False)
    assert len(result.bundle.models) == len(history.models)
    assert max(source.reads) <= 4
    assert sum(source.reads[:7]) == len(history.models)  # seven chunks, then the new models again
    assert 0 < sum(source.reads[7:]) <= 4  # only the new models' series are read a second time
    assert source.alive_at_read == [0] * len(source.reads)  # no earlier chunk's series still held


@dataclass
class _WatchedEngine(Engine):
    """This process as the engine, noting at each chunk's result how much of the earlier chunks'
    results the driver still holds: their results themselves, and their backtest choices."""

    results: list[weakref.ref[Any]] = field(default_factory=list)
    train_choices: list[list[weakref.ref[Any]]] = field(default_factory=list)
    alive_results: list[int] = field(default_factory=list)
    alive_train_choices: list[int] = field(default_factory=list)

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for result in super().imap(fn, items):
            gc.collect()
            # The result before this one is still the driver's loop variable: count those before it.
            self.alive_results.append(sum(r() is not None for r in self.results[:-1]))
            earlier = [c for chunk in self.train_choices[:-1] for c in chunk]
            self.alive_train_choices.append(sum(c() is not None for c in earlier))
            if hasattr(result, "train"):  # a first-pass chunk's
                self.results.append(weakref.ref(result))
                self.train_choices.append([weakref.ref(c) for c in result.train or [] if c is not None])
            yield result


def test_driver_lets_go_of_each_chunks_results_once_it_has_taken_them_in(
    tmp_path: Path, history: History
) -> None:
    engine = _WatchedEngine("in-process", 1)
    watched = retrain(
        _settings(tmp_path, "watched", retrain_chunk_models=3),
        history,
        history.end,
        track=False,
        engine=engine,
    )
    assert watched.engine["chunks"] == 9
    assert engine.alive_results == [0] * len(engine.alive_results)
    # Of the backtest's choices only the plotted few keep their parameters (the report plots them);
    # the report needs the others' family, calibration and scores, kept without the parameters.
    assert max(engine.alive_train_choices) <= 6
    assert sum(map(len, engine.train_choices)) > 20
    whole = retrain(
        _settings(tmp_path, "whole", retrain_chunk_models=1000), history, history.end, track=False
    )
    assert _choices(watched.bundle) == _choices(whole.bundle)
    assert watched.report is not None
    assert whole.report is not None
    assert watched.report.per_model == whole.report.per_model
    assert watched.report.test.models == whole.report.test.models
    np.testing.assert_array_equal(watched.report.p, whole.report.p)
    assert _choices(watched.report.bundle) == _choices(whole.report.bundle)


def test_synthetic_series_chunks_are_the_rows_of_the_whole_generated_trace() -> None:
    whole = generate(12, 1, seed=4)
    series = SyntheticSeries(12, 1, seed=4)
    part = series.chunk([3, 4, 5], portable=True).read()
    scattered = series.chunk([2, 7], portable=True).read()
    assert part.models == whole.models[3:6]
    assert scattered.models == [whole.models[2], whole.models[7]]
    np.testing.assert_array_equal(part.counts, whole.counts[3:6])
    np.testing.assert_array_equal(scattered.counts, whole.counts[[2, 7]])
    assert (series.start, series.minutes) == (int(whole.start), whole.minutes)


def _store_with_history(tmp_path: Path) -> float:
    from ingest import Cell, DemandStore

    trace = generate(6, 4, seed=5)
    store = DemandStore(f"sqlite:///{tmp_path / 'prewarm.db'}")
    cells = {
        (model, int(trace.start) + 60 * int(m)): Cell(requests=int(trace.counts[i, m]))
        for i, model in enumerate(trace.models)
        for m in np.flatnonzero(trace.counts[i])
    }
    store.add_counts(cells, {})
    store.close()
    return trace.start + 4 * DAY


def _train(tmp_path: Path, now: float, *options: str) -> dict[str, Any]:
    common = ["--set", f"data_dir={tmp_path}", "--set", "holdout_days=1", "--set", "retrain_chunk_models=2"]
    result = CliRunner().invoke(
        app, [*common, "forecast", "train", "--now", str(now), "--no-track", *options, "--json", "-"]
    )
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{") :])
    return summary


@pytest.mark.usefixtures("clean_env")  # the store must be this test's SQLite file, not the stack's
def test_train_fits_on_the_cluster_at_the_scheduler_address(tmp_path: Path) -> None:
    from distributed import LocalCluster

    now = _store_with_history(tmp_path)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", dashboard_address=None
    ) as cluster:
        summary = _train(tmp_path, now, "--scheduler-address", cluster.scheduler_address)
    assert summary["engine"]["kind"] == "remote"
    assert summary["engine"]["chunks"] == 3
    assert summary["models"] == 6


@pytest.mark.usefixtures("clean_env")
def test_train_workers_option_starts_a_local_pool_of_that_many_processes(tmp_path: Path) -> None:
    now = _store_with_history(tmp_path)
    single = _train(tmp_path, now)
    pooled = _train(tmp_path, now, "--workers", "2")
    assert single["engine"]["kind"] == "in-process"
    assert pooled["engine"]["kind"] == "local"
    assert pooled["engine"]["workers"] == 2
    assert pooled["families_chosen"] == single["families_chosen"]
    assert pooled["aggregate"] == {**single["aggregate"], "fit_seconds": pooled["aggregate"]["fit_seconds"]}
