"""Notebooks are documentation that runs: each one's code cells execute, in order, on small inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_code_cells_run_in_order(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("PREWARM_")]:
        monkeypatch.delenv(key)
    cells = json.loads(path.read_text())["cells"]
    scope: dict[str, object] = {}
    for index, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        exec(compile(source, f"{path.name}[{index}]", "exec"), scope)
    assert scope, "the notebook has no code"
