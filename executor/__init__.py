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

The node daemon (``ExecutorDaemon`` and ``run_forever``: orders in, state out, the load API) and the
loader benchmark ``run_load_benchmark`` are imported on first use, so a user of the pipeline alone never
loads FastAPI or kafka-python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor._executor import Executor, LoadResult
from executor._l2 import VerifyResult
from executor._l3 import FileStore, ObjectStore, S3Store, open_store, register_store
from executor._safetensors import Layout, TensorEntry, parse_header, tensor_views

if TYPE_CHECKING:
    from executor._bench import run_load_benchmark
    from executor.daemon import ExecutorDaemon, run_forever

__all__ = [
    "Executor",
    "ExecutorDaemon",
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
    "run_forever",
    "run_load_benchmark",
    "tensor_views",
]


def __getattr__(name: str) -> Any:
    # Plain imports rather than importlib, so the import contract sees these edges.
    if name in ("ExecutorDaemon", "run_forever"):
        from executor import daemon

        return getattr(daemon, name)
    if name == "run_load_benchmark":
        from executor import _bench

        return _bench.run_load_benchmark
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
