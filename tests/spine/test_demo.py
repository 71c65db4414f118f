"""`prewarm demo` is the main job: it must run every stage on embedded defaults, with no services."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prewarm_cli import app


@pytest.mark.slow
@pytest.mark.usefixtures("clean_env")
def test_demo_runs_every_stage_on_embedded_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["demo", "--workdir", str(tmp_path / "demo"), "--sizes", "2MB,3MB", "--fleet", "7"]
    result = CliRunner().invoke(app, [*args, "--days", "4", "--sim-hours", "1"])
    assert result.exit_code == 0, result.output
    for step in (
        "[catalog]",
        "[executor]",
        "[demand]",
        "[forecaster]",
        "[scheduler]",
        "[simulation]",
        "[policies]",
        "[engine]",
        "[done]",
    ):
        assert step in result.output
    assert "cold from L3" in result.output
    assert "prefetch demo-01" in result.output  # the hint's order, applied by the executor
    assert "reactive" in result.output
    assert "prewarm" in result.output
    assert "read 0 weight bytes from disk" in result.output  # the engine started warm from L1
    assert "histogram" in result.output
    assert "keepalive:600" in result.output
    assert (tmp_path / "demo" / "pareto.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "demo" / "mlruns").is_dir()
    assert (tmp_path / "demo" / "demand.db").is_file()


def test_demo_state_from_other_flags_is_made_again(tmp_path: Path) -> None:
    from prewarm_cli._demo import _made_with

    db = tmp_path / "demand.db"
    assert not _made_with(db, "fleet=7 days=4")
    db.write_text("rows of 7 models")
    (tmp_path / "demand.db-wal").write_text("its log")
    assert _made_with(db, "fleet=7 days=4")  # same flags: reused

    assert not _made_with(db, "fleet=9 days=4")  # other flags: gone, to be made again
    assert not db.exists()
    assert not (tmp_path / "demand.db-wal").exists()
