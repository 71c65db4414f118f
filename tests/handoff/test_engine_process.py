"""A separate engine process takes a real causal LM's weights from the executor's L1, reads none of
them from disk, and generates exactly what the same model loaded from its safetensors files does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from checkpoint_kit import (
    PROMPT,
    SHARDS,
    checkpoint_entry,
    drop_pages,
    start_engine,
    write_checkpoint,
)

from models import Catalog
from prewarm import Tier

ENGINE = """
    import gc, glob, json, os, sys
    import torch
    import transformers
    from transformers.models.llama import modeling_llama  # code, imported before anything is measured
    from prewarm_client.transformers import load_model, parameters_on_meta

    def read_bytes():
        for line in open("/proc/self/io"):
            if line.startswith("read_bytes:"):
                return int(line.split()[1])

    def memfd_ranges():
        ranges = []
        for line in open("/proc/self/maps"):
            if "memfd:prewarm-l1" in line:
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                ranges.append((start, end))
        return ranges

    model_id, socket_dir, checkpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    prompt = torch.tensor([json.loads(sys.argv[4])])
    # Code first: build the model once on the meta device, so that every module transformers imports
    # lazily is loaded (from disk, if the page cache lost it) before read_bytes is measured.
    config = transformers.AutoConfig.for_model("llama", hidden_size=8, intermediate_size=8,
                                               num_hidden_layers=1, num_attention_heads=1, vocab_size=8)
    with parameters_on_meta():
        transformers.AutoModelForCausalLM.from_config(config).load_state_dict({}, strict=False, assign=True)
    # Then the client's own path once: a first load pages in what it imports or reads lazily (from disk on
    # a new environment: a fresh clone's first run read 56 KB of it inside the measurement). The shards
    # are dropped from the page cache again after it, so the measured load would show any read of them.
    warm = load_model(model_id, socket_dir=socket_dir)
    del warm
    gc.collect()
    os.sync()
    for shard in glob.glob(os.path.join(checkpoint, "*.safetensors")):
        fd = os.open(shard, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    before = read_bytes()
    model = load_model(model_id, socket_dir=socket_dir)  # config.json from the block, like the weights
    read_from_l1 = read_bytes() - before
    ranges = memfd_ranges()
    params = list(model.parameters())
    mapped = all(any(s <= p.data_ptr() < e for s, e in ranges) for p in params)
    with torch.no_grad():
        logits = model(prompt).logits
        tokens = model.generate(prompt, max_new_tokens=16, do_sample=False)[0].tolist()

    before = read_bytes()
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    read_from_files = read_bytes() - before
    with torch.no_grad():
        same_logits = torch.equal(reference(prompt).logits, logits)
        reference_tokens = reference.generate(prompt, max_new_tokens=16, do_sample=False)[0].tolist()
    print(json.dumps({
        "read_from_l1": read_from_l1,
        "read_from_files": read_from_files,
        "mapped": mapped,
        "memfd_mappings": len(ranges),
        "dtype": str(params[0].dtype),
        "tokens": tokens,
        "reference_tokens": reference_tokens,
        "same_logits": same_logits,
        "ours_imported": sorted(m for m in ("prewarm", "executor", "models") if m in sys.modules),
    }))
"""


@pytest.mark.slow
def test_engine_process_generates_from_l1_what_the_files_give_without_reading_them(
    serve: Any, tmp_path: Path
) -> None:
    checkpoint = write_checkpoint(tmp_path / "llama-tiny")
    spec = checkpoint_entry(checkpoint, "llama-tiny")  # a sharded Hugging Face checkpoint in L3
    executor, socket_dir = serve(Catalog([spec]), l1_budget_bytes=64 * 2**20)
    executor.ensure("llama-tiny", Tier.L1)
    shards = [checkpoint / name for name in SHARDS]
    drop_pages(*shards)  # so that reading them shows in read_bytes
    engine = start_engine(ENGINE, "llama-tiny", str(socket_dir), str(checkpoint), json.dumps(PROMPT))
    out, err = engine.communicate(timeout=540)
    assert engine.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])

    assert result["read_from_l1"] == 0  # not one byte from disk while taking the weights from L1
    weight_bytes = sum(os.path.getsize(path) for path in shards)
    assert result["read_from_files"] >= 0.9 * weight_bytes  # ... which the same measurement would see
    assert result["mapped"]  # views of the shared block, not copies
    assert result["memfd_mappings"] >= 1
    assert result["dtype"] == "torch.bfloat16"
    assert result["same_logits"]
    assert result["tokens"] == result["reference_tokens"]
    assert len(set(result["tokens"][len(PROMPT) :])) > 1  # a real sequence, not one token repeated
    assert result["ours_imported"] == []  # the engine needs prewarm_client only
    assert executor.leases() == []  # the engine exited: its lease ended with it
