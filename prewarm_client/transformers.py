"""Hugging Face transformers over the client: a model whose parameters are the executor's L1 tensors.

    from prewarm_client.transformers import load_model
    model = load_model("llama-8b", sha256=digest, fallback="/models/llama-8b")
    model.generate(input_ids, max_new_tokens=32)

The model is built from the entry's ``config.json`` (from the block, else the fallback directory, else
``config=``) with its parameters on the meta device, so building it allocates no weights; then
``load_state_dict(weights, assign=True)`` makes the client's tensors the parameters themselves (views of
the shared block on the CPU: no copy). Buffers that are not in checkpoints (rotary frequencies) are
built on the real device as the model's own code computes them.

The lease is held as long as the model lives (released by a finalizer when it is collected): the
executor keeps the block in L1 and reports it in use. ``transformers`` is imported when this module is.
"""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

from prewarm_client._client import open_weights

__all__ = ["load_model", "parameters_on_meta"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device and their buffers as usual (the
    way accelerate's ``init_empty_weights(include_buffers=False)`` does it)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            current = module._parameters[name]
            assert current is not None
            kwargs = dict(current.__dict__)
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = type(current)(current.to("meta"), **kwargs)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def load_model(
    model_id: str,
    *,
    version: str | None = None,
    sha256: str | None = None,
    device: str = "cpu",
    socket_dir: str | os.PathLike[str] | None = None,
    fallback: str | os.PathLike[str] | None = None,
    config: Any = None,
    model_class: Any = None,
) -> Any:
    """The model ``model_id`` with its weights from the executor (or ``fallback``), in eval mode.

    ``config``: a ``PretrainedConfig``, a dict, or a path to ``config.json`` or its directory, when the
    entry carries none. ``model_class``: default ``AutoModelForCausalLM``.
    """
    weights = open_weights(
        model_id, version=version, sha256=sha256, device=device, socket_dir=socket_dir, fallback=fallback
    )
    try:
        cfg = _config(config, weights.read_file("config.json"), fallback)
        with parameters_on_meta():
            model = (model_class or transformers.AutoModelForCausalLM).from_config(cfg)
        if device != "cpu":
            # Only the buffers: the parameters are on meta and arrive on the device below.
            for module in model.modules():
                for name, buffer in module._buffers.items():
                    if buffer is not None:
                        module._buffers[name] = buffer.to(device)
        result = model.load_state_dict(weights, strict=False, assign=True)
        if result.unexpected_keys:
            raise ValueError(f"{model_id}: tensors the model does not have: {result.unexpected_keys[:5]}")
        model.tie_weights()  # tied parameters (lm_head ↔ embeddings) are not stored twice
        still_meta = [name for name, p in model.named_parameters() if p.is_meta]
        if still_meta:
            raise ValueError(f"{model_id}: the checkpoint lacks {still_meta[:5]}")
    except BaseException:
        weights.close()
        raise
    # The lease lasts as long as the model: its parameters are the leased block.
    weakref.finalize(model, weights.close)
    return model.eval()


def _config(config: Any, from_block: bytes | None, fallback: str | os.PathLike[str] | None) -> Any:
    if isinstance(config, transformers.PretrainedConfig):
        return config
    data: dict[str, Any] | None = None
    if isinstance(config, dict):
        data = config
    elif config is not None:
        path = Path(config)
        data = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    elif from_block is not None:
        data = json.loads(from_block)
    elif fallback is not None and (Path(fallback) / "config.json").is_file():
        data = json.loads((Path(fallback) / "config.json").read_text())
    if data is None:
        raise ValueError("the entry has no config.json: pass config= (a config, a dict or a path)")
    data = dict(data)
    return transformers.AutoConfig.for_model(data.pop("model_type"), **data)
