"""The design's import rules are a check (`make lint` runs it): the tree keeps them, and a change that
breaks one of them fails it, naming the rule."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    # lint-imports analyses the packages importable from its working directory, which comes first on
    # its path: a copy of the tree in ``root`` is checked instead of the installed one.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(REPO / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tree_keeps_every_import_rule_of_the_design() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "source", "broken"),
    [
        ("prewarm/_leak.py", "import models\n", "the spine imports none of the other packages"),
        ("executor/_leak.py", "import scheduler\n", "the executor never imports the control plane"),
        ("executor/_leak.py", "import pandas\n", "the executor never imports the control plane"),
        ("models/_leak.py", "import ingest\n", "layers point one way"),
        ("sim/_leak.py", "from forecaster import _select\n", "nobody imports a module that another"),
        ("prewarm_client/_leak.py", "import prewarm\n", "the engine-side client imports nothing of ours"),
        ("prewarm_client/_leak.py", "import pydantic\n", "the engine-side client imports nothing of ours"),
        ("scheduler/_leak.py", "import prewarm_client\n", "the client's protocol is for the node side"),
    ],
)
def test_an_import_against_the_design_fails_the_check_and_names_the_rule(
    tmp_path: Path, module: str, source: str, broken: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / module).write_text(source)
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout
    assert "BROKEN" in result.stdout
