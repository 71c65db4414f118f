"""The GPU-node executor: moves safetensors weights L3 (object store) → L2 (disk) → L1 (host RAM) →
L0 (device), verified at every step, and serves them as tensor views.

    executor = Executor(catalog, settings)
    executor.ensure("llama-8b", Tier.L1)             # prefetch to host RAM
    with executor.acquire("llama-8b") as tensors:    # on the device, pinned while in use
        model.load_state_dict(tensors, assign=True)
    executor.apply(order)                            # an order from the scheduler (idempotent)
    executor.state()                                 # what the node holds, for the scheduler

Imports only the spine, the catalog, torch, numpy, safetensors-free parsing, xxhash and filelock; boto3
is imported when an ``s3://`` store is opened. Never pandas, statsmodels, MLflow or SQLAlchemy.
"""

from __future__ import annotations

from executor._executor import Executor, LoadResult
from executor._l2 import VerifyResult
from executor._safetensors import Layout, TensorEntry, parse_header, tensor_views
from executor._stores import FileStore, ObjectStore, S3Store, open_store, register_store

__all__ = [
    "Executor",
    "FileStore",
    "Layout",
    "LoadResult",
    "ObjectStore",
    "S3Store",
    "TensorEntry",
    "VerifyResult",
    "open_store",
    "parse_header",
    "register_store",
    "tensor_views",
]
