"""The model catalog: which models exist, which version, where their weights live, how big, what digest.

An entry is one safetensors file, or a Hugging Face checkpoint directory whose ``files`` list every file
with its sha256 (``FileSpec``; the rules a checkpoint obeys are in ``_files``).
"""

from __future__ import annotations

from models._catalog import CATALOG_VERSION, Catalog, CatalogProblem, CatalogWatcher, parse_entry
from models._checkpoint import LLAMA_TINY, synth_catalog, synth_checkpoint
from models._files import INDEX_FILE, FileSpec, index_problems, manifest_sha256
from models._spec import ModelSpec, PriorityClass
from models._synth import TransformerShape, shape_for_size, write_safetensors

__all__ = [
    "CATALOG_VERSION",
    "INDEX_FILE",
    "LLAMA_TINY",
    "Catalog",
    "CatalogProblem",
    "CatalogWatcher",
    "FileSpec",
    "ModelSpec",
    "PriorityClass",
    "TransformerShape",
    "index_problems",
    "manifest_sha256",
    "parse_entry",
    "shape_for_size",
    "synth_catalog",
    "synth_checkpoint",
    "write_safetensors",
]
