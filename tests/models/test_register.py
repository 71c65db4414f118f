"""`prewarm models register` reads size and sha256 from the store that holds the weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from typer.testing import CliRunner

from models import Catalog, write_safetensors
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
