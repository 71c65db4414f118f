"""A small real causal LM for the hand-off tests, and helpers to run engine processes.

The model is a Llama-style config with tiny dimensions; its weights are drawn from a seed and written
as a sharded Hugging Face checkpoint (``model.safetensors.index.json``, two shards, ``config.json``),
since no hub is reachable from the tests. The tensor names and shapes are Llama's (what
``LlamaForCausalLM`` expects), written out here so that the test process never imports transformers;
the engine processes do.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import save_file

from models import ModelSpec, parse_entry

REPO = Path(__file__).resolve().parents[2]
CONFIG: dict[str, object] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": None,  # random weights: generate the full length, never stop early
}
PROMPT = [1, 17, 42, 99, 7, 250, 3]
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def llama_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor ``LlamaForCausalLM`` has for ``CONFIG``, drawn from ``seed``, in bf16."""
    dims: dict[str, int] = {k: v for k, v in CONFIG.items() if isinstance(v, int) and not isinstance(v, bool)}
    h, inter, v = dims["hidden_size"], dims["intermediate_size"], dims["vocab_size"]
    kv = h // dims["num_attention_heads"] * dims["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(dims["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (v, h)}
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        values = torch.randn(shape, generator=generator)
        # Large enough weights that greedy decoding wanders over the vocabulary instead of repeating.
        values = 1.0 + 0.1 * values if len(shape) == 1 else values * 0.3
        state[name] = values.to(torch.bfloat16)
    return state


def write_checkpoint(directory: Path, seed: int = 0) -> Path:
    """A sharded checkpoint in ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    state = llama_state(seed)
    names = list(state)
    half = len(names) // 2
    weight_map = {}
    for shard, keys in zip(SHARDS, (names[:half], names[half:]), strict=True):
        save_file({k: state[k] for k in keys}, str(directory / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return directory


def checkpoint_entry(directory: Path, model_id: str, version: str = "1") -> ModelSpec:
    """The catalog entry of a checkpoint directory: every file with its size and sha256."""
    files = [
        {"path": p.name, "size_bytes": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(directory.iterdir())
        if p.is_file()
    ]
    weights = sum(int(f["size_bytes"]) for f in files if str(f["path"]).endswith(".safetensors"))
    data = {
        "id": model_id,
        "version": version,
        "uri": directory.as_uri() + "/",
        "size_bytes": weights,
        "files": files,
    }
    return parse_entry(data, source=str(directory))


def single_file_entry(directory: Path, model_id: str, seed: int = 0) -> ModelSpec:
    """The same tensors as one safetensors file, as a single-file catalog entry."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.safetensors"
    save_file(llama_state(seed), str(path), metadata={"format": "pt"})
    return ModelSpec(
        id=model_id, version="1", uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=sha256_of(path)
    )


def drop_pages(*paths: Path) -> None:
    """Evict the files' clean pages from the page cache, so that reading them is a disk read again."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_engine(script: str, *args: str) -> subprocess.Popen[str]:
    """A separate engine process running ``script`` (dedented), with the repository importable."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=engine_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
