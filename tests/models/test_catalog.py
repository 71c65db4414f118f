from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from safetensors import safe_open
from typer.testing import CliRunner

from models import Catalog, CatalogProblem, ModelSpec, synth_catalog
from prewarm import UnknownModel, register_scheme
from prewarm_cli import app

GOOD_SHA = "ab" * 32


def _write(path: Path, models: list[dict[str, object]]) -> Path:
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def _entry(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "llama-8b",
        "version": "1",
        "uri": "s3://models/llama-8b.safetensors",
        "size_bytes": 16_000_000_000,
        "sha256": GOOD_SHA,
    }
    return {**base, **fields}


def test_good_catalog_checks_with_status_0(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", [_entry(), _entry(id="mistral-7b", uri="file:///w/m.safetensors")])
    result = CliRunner().invoke(app, ["models", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "2 models" in result.output


def test_bad_catalog_reports_one_line_per_problem_naming_entry_and_field(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "bad.yaml",
        [
            _entry(id="../etc"),
            _entry(id="neg", size_bytes=-5),
            _entry(id="badsha", sha256="xyz"),
            _entry(id="ftp", uri="ftp://host/w.safetensors"),
            _entry(id="dup"),
            _entry(id="dup"),
        ],
    )
    result = CliRunner().invoke(app, ["models", "check", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 5, result.output
    expectations = [
        ("models[0]", ".id:", "'..'"),
        ("models[1] (neg)", ".size_bytes:", "greater than 0"),
        ("models[2] (badsha)", ".sha256:", "64 lowercase hex"),
        ("models[3] (ftp)", ".uri:", "scheme"),
        ("models[5] (dup)", ".id:", "duplicate"),
    ]
    for line, (entry, field, why) in zip(lines, expectations, strict=True):
        assert entry in line
        assert field in line
        assert why in line


def test_catalog_round_trips_through_yaml(tmp_path: Path) -> None:
    catalog = Catalog([ModelSpec.model_validate(_entry()), ModelSpec.model_validate(_entry(id="b"))])
    catalog.save(tmp_path / "c.yaml")
    again = Catalog.load(tmp_path / "c.yaml")
    assert list(again) == list(catalog)


def test_lookup_of_unknown_model_raises_unknown_model() -> None:
    with pytest.raises(UnknownModel) as info:
        Catalog([])["nope"]
    assert isinstance(info.value, LookupError)


def test_unsupported_catalog_version_is_refused() -> None:
    with pytest.raises(CatalogProblem, match="version"):
        Catalog.from_data({"version": 2, "models": []})


def test_synth_writes_loadable_safetensors_with_transformer_layout(tmp_path: Path) -> None:
    catalog = synth_catalog(tmp_path, [2_000_000, 5_000_000], dtype="BF16")
    assert Catalog.load(tmp_path / "catalog.yaml").ids() == ["demo-00", "demo-01"]
    for spec in catalog:
        path = Path(spec.uri.removeprefix("file://"))
        assert path.stat().st_size == spec.size_bytes
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            assert "model.embed_tokens.weight" in names
            assert any(".self_attn.q_proj." in n for n in names)
            assert any(".mlp.down_proj." in n for n in names)
            tensor = f.get_tensor("lm_head.weight")
            assert str(tensor.dtype) == "torch.bfloat16"
            assert 0 < float(tensor.float().std()) < 0.1


def test_synth_is_deterministic(tmp_path: Path) -> None:
    first = synth_catalog(tmp_path / "a", [1_000_000])
    second = synth_catalog(tmp_path / "b", [1_000_000])
    assert [s.sha256 for s in first] == [s.sha256 for s in second]


def test_synth_cli_writes_catalog(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["models", "synth", "--out", str(tmp_path), "--sizes", "1MB,2MB", "--count", "3"]
    )
    assert result.exit_code == 0, result.output
    assert len(Catalog.load(tmp_path / "catalog.yaml")) == 3


def test_watcher_returns_a_changed_catalog_once_and_skips_a_broken_one(tmp_path: Path) -> None:
    import os

    from models import CatalogWatcher

    path = _write(tmp_path / "c.yaml", [_entry()])
    watcher = CatalogWatcher(path)
    assert watcher.poll() is None  # unchanged since the watcher was made

    _write(path, [_entry(), _entry(id="second")])
    os.utime(path, (1, 1))
    changed = watcher.poll()
    assert changed is not None
    assert changed.ids() == ["llama-8b", "second"]
    assert watcher.poll() is None

    _write(path, [_entry(id="../etc")])
    os.utime(path, (2, 2))
    assert watcher.poll() is None  # invalid: logged, the service keeps what it has


def test_a_scheme_registered_in_the_spine_makes_catalog_uris_valid() -> None:
    uri = "prewarm-test-catalog://bucket/w.safetensors"
    with pytest.raises(ValueError, match="scheme"):
        ModelSpec.model_validate(_entry(uri=uri))
    register_scheme("prewarm-test-catalog")
    assert ModelSpec.model_validate(_entry(uri=uri)).uri == uri


def test_a_size_is_read_as_people_write_it_as_in_cluster_files(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", [_entry(size_bytes="16GB"), _entry(id="b", size_bytes="2GiB")])
    catalog = Catalog.load(path)
    assert [catalog["llama-8b"].size_bytes, catalog["b"].size_bytes] == [16_000_000_000, 2 * 2**30]
