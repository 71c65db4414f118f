"""The GPU-node executor: moves safetensors weights L3 (object store) → L2 (disk) → L1 (host RAM) →
L0 (device), verified at every step, and serves them as tensor views.

    executor = Executor(catalog, settings)
    executor.ensure("llama-8b", Tier.L1)             # prefetch to host RAM
    with executor.acquire("llama-8b") as tensors:    # on the device, pinned while in use
        model.load_state_dict(tensors, assign=True)
    executor.apply(order)                            # an order from the scheduler (idempotent)
    executor.state()                                 # what the node holds, for the scheduler

    register_store("hf", HubStore)                   # another uri scheme: valid in catalogs from now on
    describe_entry("s3://models/llama/", s3, model_id="llama")  # a catalog entry, sha256 per file
    ExecutorDaemon(executor, settings.kafka)         # orders in, state out, the local load API
    run_forever(daemon, host, port)                  # ... served until interrupted
    run_load_benchmark(settings, nbytes=..., ...)    # the loader benchmark (``prewarm bench load``)

    HandoffServer(executor, socket_dir).start()      # engines take L1 blocks (prewarm_client)
    executor.lease("llama-8b", sha256=...)           # ... what the socket does for each of them
    run_handoff_benchmark(settings, nbytes=..., ...) # engine from disk vs from L1 (``bench handoff``)

Imports only the spine, the catalog, torch, numpy, safetensors-free parsing, xxhash and filelock; boto3
is imported when an ``s3://`` store is opened, and FastAPI and kafka-python when the daemon is first
named (a node that only loads weights, like the GPU check, never needs them). Never pandas,
statsmodels, MLflow or SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor._bench import run_load_benchmark
from executor._executor import Executor, HostLease, LoadResult
from executor._handoff import HandoffServer
from executor._handoff_bench import run_handoff_benchmark
from executor._l2 import VerifyResult
from executor._register import DEFAULT_EXCLUDES, Registration, describe_entry
from executor._safetensors import Layout, TensorEntry, parse_header, tensor_views
from executor._stores import FileStore, ObjectStore, S3Store, open_store, register_store

if TYPE_CHECKING:
    from executor._daemon import ExecutorDaemon, run_forever

__all__ = [
    "DEFAULT_EXCLUDES",
    "Executor",
    "ExecutorDaemon",
    "FileStore",
    "HandoffServer",
    "HostLease",
    "Layout",
    "LoadResult",
    "ObjectStore",
    "Registration",
    "S3Store",
    "TensorEntry",
    "VerifyResult",
    "describe_entry",
    "open_store",
    "parse_header",
    "register_store",
    "run_forever",
    "run_handoff_benchmark",
    "run_load_benchmark",
    "tensor_views",
]

_DAEMON = frozenset({"ExecutorDaemon", "run_forever"})


def __getattr__(name: str) -> Any:
    # The daemon's names are imported on first use: they bring FastAPI and kafka-python along.
    if name in _DAEMON:
        from executor import _daemon

        return getattr(_daemon, name)
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
