"""Each package's public face is small and deliberate: pinned here, so a change to it is a decision."""

from __future__ import annotations

import importlib

import pytest

PINNED = {
    "models": [
        "CATALOG_VERSION",
        "Catalog",
        "CatalogProblem",
        "CatalogWatcher",
        "ModelSpec",
        "PriorityClass",
        "SUPPORTED_SCHEMES",
        "TransformerShape",
        "shape_for_size",
        "synth_catalog",
        "write_safetensors",
    ],
}


@pytest.mark.parametrize("package", sorted(PINNED))
def test_public_api_is_pinned(package: str) -> None:
    assert sorted(importlib.import_module(package).__all__) == sorted(PINNED[package])


@pytest.mark.parametrize(
    "package", ["prewarm", "models", "ingest", "forecaster", "scheduler", "executor", "sim"]
)
def test_every_public_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_spine_imports_no_other_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, prewarm; "
        "others = {'models', 'ingest', 'forecaster', 'scheduler', 'executor', 'sim', 'torch', 'pandas'}; "
        "print(sorted(m for m in others if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
