"""A vLLM model-loader plugin: ``--load-format prewarm`` takes the weights from the node's executor.

Installed with prewarm, it is found through the ``vllm.general_plugins`` entry point (every vLLM
process calls ``register`` before it loads a model; ``VLLM_PLUGINS`` selects plugins by name), which
registers ``PrewarmModelLoader`` with vLLM's ``register_model_loader``. Then:

    vllm serve /models/llama-8b --load-format prewarm \\
        --model-loader-extra-config '{"model_id": "llama-8b", "sha256": "..."}'

vLLM builds the model as usual (from the config in ``/models/llama-8b``); the loader feeds
``iter_weights`` to ``model.load_weights``, which copies each tensor, or each rank's shard of it, from
the executor's shared L1 block to the GPU. Options (``--model-loader-extra-config``): ``model_id``
(default: the model directory's name), ``version``, ``sha256``, ``socket_dir`` (default:
``PREWARM_SOCKET_DIR`` or the per-user default) and ``fallback`` (default: the model directory when it
holds safetensors files), read when no executor answers.

vLLM is imported only inside ``register`` and the loader class: importing this module needs neither vLLM
nor a GPU, and everything but the registration itself is plain code over the client (``LoaderOptions``,
``load_into``), tested without vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm_client._client import iter_weights

__all__ = ["LOAD_FORMAT", "LoaderOptions", "load_into", "loader_class", "register"]

LOAD_FORMAT = "prewarm"
_OPTIONS = frozenset({"model_id", "version", "sha256", "socket_dir", "fallback"})
_loader: Any = None


@dataclass(frozen=True)
class LoaderOptions:
    model_id: str
    version: str | None = None
    sha256: str | None = None
    socket_dir: str | None = None
    fallback: str | None = None

    @classmethod
    def from_config(cls, extra: Mapping[str, Any] | None, model_path: str) -> LoaderOptions:
        """From vLLM's ``model_loader_extra_config`` and the model path vLLM was given."""
        extra = dict(extra or {})
        unknown = set(extra) - _OPTIONS
        if unknown:
            raise ValueError(f"unknown prewarm loader options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
        path = Path(model_path)
        fallback = extra.get("fallback")
        if fallback is None and path.is_dir() and any(path.glob("*.safetensors")):
            fallback = str(path)
        return cls(
            model_id=str(extra.get("model_id") or path.name),
            version=extra.get("version"),
            sha256=extra.get("sha256"),
            socket_dir=extra.get("socket_dir"),
            fallback=fallback,
        )


def load_into(model: Any, options: LoaderOptions) -> set[str] | None:
    """Feed the model's weights to ``model.load_weights`` (vLLM's model interface), holding the lease
    until every tensor has been consumed; raise when a parameter was left without weights."""
    expected = {name for name, _ in model.named_parameters()}
    weights = iter_weights(
        options.model_id,
        version=options.version,
        sha256=options.sha256,
        socket_dir=options.socket_dir,
        fallback=options.fallback,
    )
    try:
        loaded: set[str] | None = model.load_weights(weights)
    finally:
        weights.close()  # ends the lease even if load_weights stopped early
    if loaded is not None and expected - loaded:
        missing = sorted(expected - loaded)
        raise ValueError(f"{options.model_id}: weights not initialized from prewarm: {missing}")
    return loaded


def loader_class() -> Any:
    """The ``BaseModelLoader`` subclass, built on first use (it needs vLLM)."""
    global _loader
    if _loader is None:
        from vllm.model_executor.model_loader import BaseModelLoader

        class PrewarmModelLoader(BaseModelLoader):  # type: ignore[misc]
            """Weights from prewarm's executor over its hand-off socket (``prewarm_client``)."""

            def __init__(self, load_config: Any) -> None:
                super().__init__(load_config)
                self._extra = dict(load_config.model_loader_extra_config or {})

            def download_model(self, model_config: Any) -> None:
                # Nothing to download: the executor brings the weights to L1 when asked.
                return None

            def load_weights(self, model: Any, model_config: Any) -> None:
                load_into(model, LoaderOptions.from_config(self._extra, str(model_config.model)))

        _loader = PrewarmModelLoader
    return _loader


def register() -> None:
    """The ``vllm.general_plugins`` entry point: make ``--load-format prewarm`` known to vLLM."""
    from vllm.model_executor.model_loader import register_model_loader

    register_model_loader(LOAD_FORMAT)(loader_class())
