"""Object stores are pluggable by uri scheme, and a registered scheme is one every catalog accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from executor_testkit import ExecutorFactory, make_model, serves

from executor import FileStore, ObjectStore, open_store, register_store
from executor._stores import OnPiece
from models import Catalog, ModelSpec
from prewarm import ConfigError, ObjectStoreError, S3Settings, Tier, known_schemes

_SCHEME = "prewarm-test-mirror"


class _Mirror(ObjectStore):
    """Serves ``prewarm-test-mirror:///path`` from the local file ``/path``, recording what it is asked."""

    scheme = _SCHEME

    def __init__(self) -> None:
        self._files = FileStore()
        self.asked: list[str] = []

    def _file(self, uri: str) -> str:
        self.asked.append(uri)
        return "file://" + uri.removeprefix(f"{_SCHEME}://")

    def size(self, uri: str) -> int:
        return self._files.size(self._file(uri))

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        return self._files.read_range(self._file(uri), start, end)

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        self._files.read_range_into(self._file(uri), start, dest, on_piece)


def test_a_store_registered_for_a_new_scheme_makes_its_catalog_valid_and_serves_it(
    weights_dir: Path, tmp_path: Path, make_executor: ExecutorFactory
) -> None:
    local = make_model(weights_dir, "mirrored", seed=7)
    weights = FileStore.path(local.uri)
    entry = {**local.model_dump(mode="json"), "uri": f"{_SCHEME}://{weights}"}
    with pytest.raises(ValueError, match="scheme"):
        ModelSpec.model_validate(entry)  # nobody serves the scheme yet: the catalog refuses it

    mirror = _Mirror()
    register_store(_SCHEME, lambda _s3: mirror)

    assert _SCHEME in known_schemes()  # registered in the spine, for every catalog reader
    Catalog([ModelSpec.model_validate(entry)]).save(tmp_path / "catalog.yaml")
    catalog = Catalog.load(tmp_path / "catalog.yaml")
    executor = make_executor(catalog)
    result = executor.ensure("mirrored", Tier.L0)

    assert result.served_from is Tier.L3
    assert mirror.asked
    assert all(uri == entry["uri"] for uri in mirror.asked)
    assert serves(executor, catalog["mirrored"], weights)


def test_a_uri_no_store_serves_is_refused_naming_the_known_schemes() -> None:
    with pytest.raises(ObjectStoreError, match="no object store for 'gopher'") as info:
        open_store("gopher://host/w.safetensors", S3Settings.model_construct())
    assert "file" in str(info.value)
    assert "s3" in str(info.value)


def test_direct_l0_is_refused_where_device_memory_is_not_host_memory(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: on the CPU device direct_l0 is the default")
    with pytest.raises(ConfigError, match="direct_l0"):
        make_executor(catalog, device="cuda", direct_l0=True)
