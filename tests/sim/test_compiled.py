"""The compiled run loop: found only for the sources it was built from, and the pure one's figures."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prewarm_cli import app
from sim import _compiled

# Every policy but prewarm (which needs a fitted forecast) on a small trace that crowds its cluster:
# loads queue, links are shared, GPU copies are displaced.
RUN = """
import json
from prewarm_cli._sim import speed_trace
from sim import default_cluster, run_policies, running_compiled, virtual_catalog
start = 1_704_412_800.0
events = speed_trace(6_000, 30, 6.0, seed=3, start=start)
catalog = virtual_catalog(sorted(events["model"].unique()))
labels = ["reactive", "keepalive:600", "histogram", "oracle"]
runs = run_policies(events, catalog, default_cluster(2, 2), labels, start=start, end=start + 6 * 3600)
print(json.dumps({"compiled": running_compiled(), "runs": {k: r.to_json() for k, r in runs.items()}}))
"""


def _copy_sources(into: Path) -> Path:
    into.mkdir()
    for name in _compiled.COMPILED:
        shutil.copyfile(Path(_compiled.__file__).with_name(f"{name}.py"), into / f"{name}.py")
    return into


def test_an_edited_source_names_another_build_so_a_stale_one_is_never_loaded(tmp_path: Path) -> None:
    package = _copy_sources(tmp_path / "sim")
    before = _compiled.compile_dir(tmp_path / "builds", package)
    (package / "_world.py").write_text((package / "_world.py").read_text() + "\n# edited\n")
    after = _compiled.compile_dir(tmp_path / "builds", package)
    assert before.parent == after.parent == tmp_path / "builds"
    assert before.name != after.name


def test_a_build_counts_only_when_every_module_is_in_it(tmp_path: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in _compiled.COMPILED[:-1]:
        (tmp_path / f"{name}{suffix}").touch()
    assert not _compiled.is_compiled(tmp_path)
    (tmp_path / f"{_compiled.COMPILED[-1]}{suffix}").touch()
    assert _compiled.is_compiled(tmp_path)


def test_install_finds_the_compiled_modules_only_when_built_and_not_asked_for_the_pure_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A meta path of this test's own: what install adds goes when the test ends, and the finder that
    # loaded this process's modules (if any) is not there to say "installed already".
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _compiled._Finder)])
    monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
    assert not _compiled.install(tmp_path)
    assert not any(isinstance(f, _compiled._Finder) for f in sys.meta_path)

    build = _compiled.compile_dir(tmp_path)
    build.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in _compiled.COMPILED:
        (build / f"{name}{suffix}").touch()  # never imported here: only found
    monkeypatch.setenv(_compiled.PURE_ENV, "1")
    assert not _compiled.install(tmp_path)

    monkeypatch.setenv(_compiled.PURE_ENV, "0")
    assert _compiled.install(tmp_path)
    finder = sys.meta_path[0]
    assert isinstance(finder, _compiled._Finder)
    spec = finder.find_spec("sim._world")
    assert spec is not None
    assert spec.origin == str(build / f"_world{suffix}")
    assert finder.find_spec("sim._bench") is None  # not compiled: found among the sources as always


def test_the_compiled_run_loop_gives_every_figure_of_the_pure_one() -> None:
    if not _compiled.is_compiled(_compiled.compile_dir()):
        why = "the simulator is not compiled here (`prewarm sim compile`; `make env` runs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    said = {}
    for pure in ("1", "0"):
        env = {**os.environ, _compiled.PURE_ENV: pure}
        done = subprocess.run(
            [sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True
        )
        said[pure] = json.loads(done.stdout)
    assert said["1"]["compiled"] is False
    assert said["0"]["compiled"] is True
    assert said["0"]["runs"] == said["1"]["runs"]
    assert said["0"]["runs"]["reactive"]["cold_starts"] > 0


def test_sim_compile_check_says_whether_the_present_sources_are_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_compiled.BUILD_ENV, str(tmp_path))
    result = CliRunner().invoke(app, ["sim", "compile", "--check"])
    assert result.exit_code == 1
    assert "not compiled, the pure modules run" in result.output
    build = _compiled.compile_dir()
    assert build.parent == tmp_path
    build.mkdir()
    for name in _compiled.COMPILED:
        (build / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}").touch()
    result = CliRunner().invoke(app, ["sim", "compile", "--check"])
    assert result.exit_code == 0, result.output
    assert f"{build}: compiled" in result.output
