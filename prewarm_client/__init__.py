"""The engine side of prewarm: a model's weights from the node's executor, without touching disk.

    from prewarm_client import open_weights, iter_weights

    with open_weights("llama-8b", version="3", sha256=digest, fallback="/models/llama-8b") as weights:
        model.load_state_dict(weights, assign=True)     # views of the executor's shared L1 block
    model.load_weights(iter_weights("llama-8b"))        # vLLM-style (name, tensor) stream

    open_weights("llama-8b", device="cuda", mode="share")  # the executor's L0 copy, over CUDA IPC
    open_weights("llama-8b", rank=1)                    # rank 1's shard of a model held across GPUs

    prewarm_client.transformers.load_model("llama-8b")  # a transformers model built on it
    vllm serve ... --load-format prewarm                # prewarm_client.vllm, an entry-point plugin
    prewarm_client.vllm_sleep.VllmSleepClient(url).sleep()  # a running vLLM engine's weights L0 -> L1

The hand-off protocol's definitions live here too (``BlockLayout``, ``OpenRequest``, ``send_message``,
``recv_message``; for L0, ``CudaIpcHandle``, ``DeviceShard`` and ``TensorTable``): the executor imports
them from this package. This package imports only the standard
library, numpy, torch and safetensors, never the rest of prewarm (whose spine loads pydantic and yaml):
an engine process needs nothing else.
"""

from __future__ import annotations

from prewarm_client._client import Weights, checkpoint_files, iter_weights, open_weights
from prewarm_client._ipc import CudaIpcHandle, DeviceShard, TableEntry, TensorTable
from prewarm_client._protocol import (
    ENV_SOCKET_DIR,
    PROTOCOL_VERSION,
    SOCKET_NAME,
    BlockLayout,
    ExecutorUnavailable,
    FileSlice,
    HandoffError,
    OpenRequest,
    ProtocolError,
    Refused,
    default_socket_dir,
    recv_message,
    send_message,
)

__all__ = [
    "ENV_SOCKET_DIR",
    "PROTOCOL_VERSION",
    "SOCKET_NAME",
    "BlockLayout",
    "CudaIpcHandle",
    "DeviceShard",
    "ExecutorUnavailable",
    "FileSlice",
    "HandoffError",
    "OpenRequest",
    "ProtocolError",
    "Refused",
    "TableEntry",
    "TensorTable",
    "Weights",
    "checkpoint_files",
    "default_socket_dir",
    "iter_weights",
    "open_weights",
    "recv_message",
    "send_message",
]
