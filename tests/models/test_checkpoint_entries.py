"""Checkpoint entries in the catalog: the rules a Hugging Face directory obeys, and the synthesized one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from models import (
    INDEX_FILE,
    Catalog,
    CatalogProblem,
    FileSpec,
    ModelSpec,
    index_problems,
    manifest_sha256,
    synth_checkpoint,
)
from prewarm_cli import app

SHA = "ab" * 32


def _checkpoint(**fields: Any) -> dict[str, Any]:
    files = [
        {"path": "config.json", "size_bytes": 600, "sha256": SHA},
        {"path": INDEX_FILE, "size_bytes": 1700, "sha256": SHA},
        {"path": "model-00001-of-00002.safetensors", "size_bytes": 1000, "sha256": SHA},
        {"path": "model-00002-of-00002.safetensors", "size_bytes": 500, "sha256": SHA},
    ]
    base: dict[str, Any] = {
        "id": "org/llama",
        "version": "1",
        "uri": "s3://models/org/llama/",
        "size_bytes": 1500,
        "files": files,
    }
    return {**base, **fields}


def _problems(entry: dict[str, Any]) -> list[str]:
    with pytest.raises(CatalogProblem) as info:
        Catalog.from_data({"models": [entry]})
    return info.value.problems


def _files_with(change: dict[str, Any], at: int = 0) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = [dict(f) for f in _checkpoint()["files"]]
    files[at].update(change)
    return files


def test_a_checkpoint_entry_gets_its_manifest_digest_as_its_sha256() -> None:
    spec = ModelSpec.model_validate(_checkpoint())
    assert spec.is_checkpoint
    assert spec.sha256 == manifest_sha256(spec.files)
    assert [f.path for f in spec.weight_files()] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert spec.file_uri("config.json") == "s3://models/org/llama/config.json"


def test_a_single_file_entry_is_its_own_weight_file() -> None:
    spec = ModelSpec(id="m", version="1", uri="file:///w/m%20v1.safetensors", size_bytes=10, sha256=SHA)
    assert not spec.is_checkpoint
    assert spec.weight_files() == (FileSpec(path="m v1.safetensors", size_bytes=10, sha256=SHA),)
    assert spec.file_uri("anything") == spec.uri


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "must be relative"),
        ("../outside.json", "'..'"),
        ("a//b.json", "empty"),
        ("a\\b.json", "'/' separators"),
    ],
)
def test_a_file_path_that_could_leave_the_directory_is_refused(path: str, why: str) -> None:
    problems = _problems(_checkpoint(files=_files_with({"path": path})))
    assert len(problems) == 1
    assert problems[0].startswith("models[0] (org/llama).files[0].path:")
    assert why in problems[0]


def test_every_checkpoint_problem_is_named_on_its_own_line() -> None:
    files = _files_with({"sha256": None}, at=0)
    files.append({"path": "config.json", "size_bytes": 600, "sha256": SHA})
    files.append({"path": "pytorch_model.bin", "size_bytes": 9, "sha256": SHA})
    problems = _problems(_checkpoint(files=files, size_bytes=7))
    assert problems == [
        "models[0] (org/llama).files[0].sha256: required for every file of a checkpoint (config.json)",
        "models[0] (org/llama).files[4].path: 'config.json' is listed twice (first at files[0])",
        "models[0] (org/llama).files[5].path: 'pytorch_model.bin': weights are accepted as safetensors only "
        "(leave it out of the entry)",
        "models[0] (org/llama).size_bytes: 7 is not the sum of the safetensors files (1500)",
    ]


def test_shards_without_an_index_are_refused() -> None:
    files = [f for f in _checkpoint()["files"] if f["path"] != INDEX_FILE]
    (problem,) = _problems(_checkpoint(files=files))
    assert "2 safetensors shards but no model.safetensors.index.json" in problem


def test_a_checkpoint_without_weights_is_refused() -> None:
    files = [{"path": "config.json", "size_bytes": 600, "sha256": SHA}]
    (problem,) = _problems(_checkpoint(files=files))
    assert "no .safetensors file" in problem


def test_a_sha256_that_is_not_the_files_digest_is_refused() -> None:
    (problem,) = _problems(_checkpoint(sha256="cd" * 32))
    assert problem.startswith("models[0] (org/llama).sha256:")
    assert "not the digest of the listed files" in problem


def test_index_must_name_exactly_the_listed_shards() -> None:
    spec = ModelSpec.model_validate(_checkpoint())
    index = json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00003-of-00003.safetensors"}}
    ).encode()
    assert index_problems(index, spec.files) == [
        f"{INDEX_FILE}: weight_map names shards that are not listed: model-00003-of-00003.safetensors",
        f"{INDEX_FILE}: listed safetensors files that weight_map does not name: "
        "model-00002-of-00002.safetensors (leave them out of the entry, or fix the index)",
    ]
    assert index_problems(b"[1, 2]", spec.files) == [
        f"{INDEX_FILE}: needs a 'weight_map' object mapping tensor names to shard files"
    ]


def test_a_checkpoint_entry_round_trips_through_yaml_and_single_files_stay_as_they_were(
    tmp_path: Path,
) -> None:
    single = ModelSpec(id="m", version="1", uri="file:///w/m.safetensors", size_bytes=10, sha256=SHA)
    catalog = Catalog([ModelSpec.model_validate(_checkpoint()), single])
    catalog.save(tmp_path / "c.yaml")
    assert list(Catalog.load(tmp_path / "c.yaml")) == list(catalog)
    written = yaml.safe_load((tmp_path / "c.yaml").read_text())["models"]
    assert "files" not in written[1]
    assert len(written[0]["files"]) == 4


def test_synthesized_checkpoint_loads_with_safetensors_and_its_index_matches(tmp_path: Path) -> None:
    spec = synth_checkpoint(tmp_path / "llama", shards=3)
    root = tmp_path / "llama"
    index = json.loads((root / INDEX_FILE).read_text())
    shards = sorted({*index["weight_map"].values()})
    assert shards == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert [f.path for f in spec.weight_files()] == shards
    held: dict[str, str] = {}
    for shard in shards:
        with safe_open(str(root / shard), framework="pt") as f:
            held.update(dict.fromkeys(f.keys(), shard))
    assert held == index["weight_map"]
    tensors = {k: v for shard in shards for k, v in load_file(str(root / shard)).items()}
    config = json.loads((root / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    assert tensors["model.embed_tokens.weight"].shape == (config["vocab_size"], hidden)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (heads * head_dim, hidden)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (kv * head_dim, hidden)
    assert tensors["lm_head.weight"].shape == (config["vocab_size"], hidden)
    assert len([k for k in tensors if k.startswith("model.layers.")]) == 9 * config["num_hidden_layers"]
    assert str(tensors["lm_head.weight"].dtype) == "torch." + config["torch_dtype"]
    assert bool((tensors["model.norm.weight"] == 1).all())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert spec.size_bytes == sum((root / s).stat().st_size for s in shards)
    assert json.loads((root / "generation_config.json").read_text())["do_sample"] is False


def test_synthesized_checkpoints_are_deterministic(tmp_path: Path) -> None:
    first = synth_checkpoint(tmp_path / "a")
    second = synth_checkpoint(tmp_path / "b")
    assert first.files == second.files
    assert first.sha256 == second.sha256


def test_synth_cli_writes_single_files_by_default_and_checkpoints_with_hf(tmp_path: Path) -> None:
    runner = CliRunner()
    plain = runner.invoke(app, ["models", "synth", "--out", str(tmp_path / "p"), "--sizes", "1MB"])
    assert plain.exit_code == 0, plain.output
    assert not Catalog.load(tmp_path / "p" / "catalog.yaml")["demo-00"].is_checkpoint

    args = ["models", "synth", "--out", str(tmp_path / "h"), "--sizes", "1MB", "--hf", "--shards", "2"]
    hf = runner.invoke(app, args)
    assert hf.exit_code == 0, hf.output
    spec = Catalog.load(tmp_path / "h" / "catalog.yaml")["demo-00"]
    assert spec.is_checkpoint
    assert {f.path for f in spec.files} >= {"config.json", INDEX_FILE, "model-00001-of-00002.safetensors"}
    assert (tmp_path / "h" / "demo-00" / "config.json").is_file()
    assert "tokenizer files: not written" in hf.output
