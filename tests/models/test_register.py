"""`prewarm models register` reads sizes and sha256 from the store that holds the weights: one file or a
whole checkpoint directory or prefix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from click.testing import Result
from typer.testing import CliRunner

from models import INDEX_FILE, Catalog, synth_checkpoint, write_safetensors
from models._synth import TransformerShape
from prewarm_cli import app

SHAPE = TransformerShape(hidden=64, layers=2, vocab=256, intermediate=128)


def _weights(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "tiny.safetensors"
    sha = write_safetensors(path, SHAPE)
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    return path, sha


@pytest.mark.usefixtures("clean_env")
def test_register_file_uri_adds_size_and_sha256(tmp_path: Path) -> None:
    path, sha = _weights(tmp_path)
    catalog = tmp_path / "catalog.yaml"
    result = CliRunner().invoke(
        app, ["models", "register", path.as_uri(), "--id", "tiny", "--catalog", str(catalog)]
    )
    assert result.exit_code == 0, result.output
    spec = Catalog.load(catalog)["tiny"]
    assert (spec.size_bytes, spec.sha256, spec.uri) == (path.stat().st_size, sha, path.as_uri())


@pytest.mark.usefixtures("clean_env")
def test_register_replaces_an_entry_with_a_new_version(tmp_path: Path) -> None:
    path, _ = _weights(tmp_path)
    catalog = tmp_path / "catalog.yaml"
    for version in ("1", "2"):
        args = ["models", "register", path.as_uri(), "--id", "tiny", "--version", version]
        result = CliRunner().invoke(app, [*args, "--catalog", str(catalog)])
        assert result.exit_code == 0, result.output
    loaded = Catalog.load(catalog)
    assert len(loaded) == 1
    assert loaded["tiny"].version == "2"


def test_register_s3_uri_reads_the_object_from_the_s3_server(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sha = _weights(tmp_path)
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    key = f"register-{unique}/tiny.safetensors"
    client.upload_file(str(path), s3_bucket, key)
    try:
        monkeypatch.setenv("PREWARM_S3_ENDPOINT", s3_endpoint)
        catalog = tmp_path / "catalog.yaml"
        uri = f"s3://{s3_bucket}/{key}"
        result = CliRunner().invoke(
            app, ["models", "register", uri, "--id", "tiny", "--catalog", str(catalog)]
        )
        assert result.exit_code == 0, result.output
        spec = Catalog.load(catalog)["tiny"]
        assert (spec.size_bytes, spec.sha256, spec.uri) == (path.stat().st_size, sha, uri)
    finally:
        client.delete_object(Bucket=s3_bucket, Key=key)


@pytest.mark.usefixtures("clean_env")
def test_register_without_a_catalog_exits_2_naming_the_setting(tmp_path: Path) -> None:
    path, _ = _weights(tmp_path)
    result = CliRunner().invoke(app, ["models", "register", path.as_uri(), "--id", "tiny"])
    assert result.exit_code == 2
    assert "PREWARM_CATALOG" in result.output


def _s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", config=Config(s3={"addressing_style": "path"})
    )


def _register(*args: str) -> Result:
    return CliRunner().invoke(app, ["models", "register", *args])


@pytest.mark.usefixtures("clean_env")
def test_register_a_checkpoint_directory_lists_every_file_with_its_sha256(tmp_path: Path) -> None:
    expected = synth_checkpoint(tmp_path / "llama", model_id="llama")
    catalog = tmp_path / "catalog.yaml"

    result = _register(str(tmp_path / "llama"), "--id", "llama", "--catalog", str(catalog))

    assert result.exit_code == 0, result.output
    spec = Catalog.load(catalog)["llama"]
    assert spec == expected  # the same files, sizes, digests, fingerprint and uri as when written
    assert spec.uri == (tmp_path / "llama").resolve().as_uri() + "/"
    for f in spec.files:
        assert f.sha256 == hashlib.sha256((tmp_path / "llama" / f.path).read_bytes()).hexdigest()


@pytest.mark.usefixtures("clean_env")
def test_register_leaves_out_hidden_files_and_pickled_weights_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "llama"
    expected = synth_checkpoint(root, model_id="llama")
    (root / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (root / "original").mkdir()
    (root / "original" / "consolidated.00.pth").write_bytes(b"pickle")
    (root / "README.md").write_text("# llama\n")
    catalog = tmp_path / "catalog.yaml"

    result = _register(root.as_uri(), "--id", "llama", "--catalog", str(catalog), "--exclude", "*.md")

    assert result.exit_code == 0, result.output
    assert Catalog.load(catalog)["llama"].files == expected.files
    assert "left out: .gitattributes (hidden)" in result.output
    assert "left out: original/consolidated.00.pth (excluded" in result.output
    assert "left out: README.md (excluded" in result.output


@pytest.mark.usefixtures("clean_env")
def test_register_refuses_an_index_that_does_not_say_where_the_tensors_are(tmp_path: Path) -> None:
    root = tmp_path / "llama"
    synth_checkpoint(root, model_id="llama")
    index = json.loads((root / INDEX_FILE).read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"  # it is in shard 2
    (root / INDEX_FILE).write_text(json.dumps(index))
    catalog = tmp_path / "catalog.yaml"

    result = _register(str(root), "--id", "llama", "--catalog", str(catalog))

    assert result.exit_code == 2
    assert "model-00001-of-00002.safetensors lacks lm_head.weight that weight_map puts there" in result.output
    assert (
        "model-00002-of-00002.safetensors holds lm_head.weight that weight_map puts elsewhere"
        in result.output
    )
    assert not catalog.exists()


def test_register_from_an_s3_prefix_gives_the_entry_the_directory_gives(
    tmp_path: Path, s3_endpoint: str, s3_bucket: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "llama"
    synth_checkpoint(root, model_id="llama")
    client = _s3_client(s3_endpoint)
    prefix = f"register-{unique}/org/llama"
    keys = [f"{prefix}/{p.relative_to(root).as_posix()}" for p in sorted(root.rglob("*")) if p.is_file()]
    for key in keys:
        client.upload_file(str(root / key.removeprefix(prefix + "/")), s3_bucket, key)
    # Another model whose prefix starts like this one's: listing "llama" must not take "llama-2".
    client.put_object(Bucket=s3_bucket, Key=f"{prefix}-2/config.json", Body=b"{}")
    try:
        monkeypatch.setenv("PREWARM_S3_ENDPOINT", s3_endpoint)
        from_dir, from_s3 = tmp_path / "dir.yaml", tmp_path / "s3.yaml"
        assert _register(str(root), "--id", "org/llama", "--catalog", str(from_dir)).exit_code == 0
        result = _register(f"s3://{s3_bucket}/{prefix}", "--id", "org/llama", "--catalog", str(from_s3))
        assert result.exit_code == 0, result.output

        local, remote = Catalog.load(from_dir)["org/llama"], Catalog.load(from_s3)["org/llama"]
        assert remote.uri == f"s3://{s3_bucket}/{prefix}/"
        assert remote.model_copy(update={"uri": local.uri}) == local
        assert (remote.files, remote.sha256, remote.size_bytes) == (
            local.files,
            local.sha256,
            local.size_bytes,
        )
    finally:
        for key in [*keys, f"{prefix}-2/config.json"]:
            client.delete_object(Bucket=s3_bucket, Key=key)
