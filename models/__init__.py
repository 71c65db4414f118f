"""The model catalog: which models exist, which version, where their weights live, how big, what digest."""

from __future__ import annotations

from models._catalog import CATALOG_VERSION, Catalog, CatalogProblem, CatalogWatcher
from models._spec import ModelSpec, PriorityClass
from models._synth import TransformerShape, shape_for_size, synth_catalog, write_safetensors

__all__ = [
    "CATALOG_VERSION",
    "Catalog",
    "CatalogProblem",
    "CatalogWatcher",
    "ModelSpec",
    "PriorityClass",
    "TransformerShape",
    "shape_for_size",
    "synth_catalog",
    "write_safetensors",
]
