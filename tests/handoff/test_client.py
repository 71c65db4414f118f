"""The client on its own: the fallback to files, the protocol's checks, the vLLM loader's plain parts."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_kit import SHARDS, write_checkpoint
from safetensors.torch import load_file

from models import Catalog
from prewarm_client import (
    BlockLayout,
    ExecutorUnavailable,
    FileSlice,
    OpenRequest,
    ProtocolError,
    default_socket_dir,
    iter_weights,
    open_weights,
)
from prewarm_client import vllm as plugin


def _expected(checkpoint: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in SHARDS:
        tensors.update(load_file(str(checkpoint / shard)))
    return tensors


def test_client_with_no_executor_falls_back_to_the_files_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    nowhere = tmp_path / "no-executor-here"
    expected = _expected(checkpoint)
    with caplog.at_level(logging.WARNING, logger="prewarm_client"):
        for _ in range(2):
            with open_weights("tiny", socket_dir=nowhere, fallback=checkpoint) as weights:
                assert weights.source == "files"
                assert not weights.leased
                assert weights.keys() == expected.keys()
                assert all(torch.equal(weights[k], v) for k, v in expected.items())
                assert weights.read_file("config.json") == (checkpoint / "config.json").read_bytes()
    assert sum("no prewarm executor" in r.getMessage() for r in caplog.records) == 1
    # One file works as a fallback too, and without a fallback there is nothing to fall back to.
    with open_weights("tiny", socket_dir=nowhere, fallback=checkpoint / SHARDS[0]) as one:
        assert one.keys() == load_file(str(checkpoint / SHARDS[0])).keys()
    with pytest.raises(ExecutorUnavailable):
        open_weights("tiny", socket_dir=nowhere)


def test_client_tensors_are_views_of_one_read_only_shared_mapping(serve: Any, two_models: Catalog) -> None:
    _executor, socket_dir = serve(two_models)
    with open_weights("m0", socket_dir=socket_dir) as weights:
        assert weights.source == "executor"
        assert weights.leased
        # In this process the executor's own mapping of the block is there too (writable); every
        # tensor must lie in the client's, which is read-only and shared.
        maps = [
            line.split()
            for line in Path("/proc/self/maps").read_text().splitlines()
            if "memfd:prewarm-l1" in line
        ]
        ranges = [(*(int(x, 16) for x in fields[0].split("-")), fields[1]) for fields in maps]
        for tensor in weights.values():
            (perms,) = [p for s, e, p in ranges if s <= tensor.data_ptr() < e]
            assert perms == "r--s"
    assert dict(iter_weights("m0", socket_dir=socket_dir)).keys() == weights.keys()


def test_block_layout_packs_files_page_aligned_and_rejects_slices_outside_the_block() -> None:
    layout = BlockLayout.pack([("a.safetensors", 5000), ("config.json", 10), ("b.safetensors", 4096)])
    assert [(f.offset, f.length) for f in layout.files] == [(0, 5000), (8192, 10), (12288, 4096)]
    assert layout.size == 16384
    assert [f.path for f in layout.weight_files] == ["a.safetensors", "b.safetensors"]
    assert BlockLayout.from_json(layout.to_json()) == layout
    for bad in (
        BlockLayout((FileSlice("a", 0, 9000),), 8192),  # runs past the block
        BlockLayout((FileSlice("a", 100, 10),), 8192),  # not page-aligned
        BlockLayout((FileSlice("../etc/passwd", 0, 10),), 8192),  # not inside the entry
    ):
        with pytest.raises(ProtocolError):
            BlockLayout.from_json(bad.to_json())


def test_open_request_validates_what_comes_over_the_socket() -> None:
    request = OpenRequest("m", version="2", sha256="ab" * 32, device="cuda:1", load=False)
    assert OpenRequest.from_json(request.to_json()) == request
    for bad in (
        {},
        {"model": ""},
        {"model": "m", "device": "tpu"},
        {"model": "m", "mode": "steal"},
        {"model": "m", "rank": -1},
    ):
        with pytest.raises(ProtocolError):
            OpenRequest.from_json(bad)


def test_socket_dir_defaults_to_the_environment_then_the_user_runtime_dir() -> None:
    assert default_socket_dir({"PREWARM_SOCKET_DIR": "/x"}) == Path("/x")
    assert default_socket_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/prewarm")
    assert str(default_socket_dir({})).startswith("/tmp/prewarm-")


class _VllmStyleModel(torch.nn.Module):
    """A model with vLLM's weight interface: ``load_weights(iterable of (name, tensor)) -> loaded names``."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names
        for i, _name in enumerate(names):
            self.register_parameter(f"p{i}", torch.nn.Parameter(torch.empty(0), requires_grad=False))

    def load_weights(self, weights: Any) -> set[str]:
        loaded = set()
        by_name = dict(zip(self.names, (f"p{i}" for i in range(len(self.names))), strict=True))
        for name, tensor in weights:
            if name in by_name:
                getattr(self, by_name[name]).data = tensor.clone()  # vLLM copies into its own params
                loaded.add(by_name[name])
        return loaded


def test_vllm_loader_feeds_the_clients_stream_to_load_weights_and_ends_the_lease(
    serve: Any, two_models: Catalog, tmp_path: Path
) -> None:
    executor, socket_dir = serve(two_models)
    names = list(load_file(str(Path(two_models["m0"].uri.removeprefix("file://")))))
    options = plugin.LoaderOptions.from_config({"socket_dir": str(socket_dir)}, str(tmp_path / "m0"))
    assert options.model_id == "m0"
    assert options.fallback is None
    model = _VllmStyleModel(names)
    assert plugin.load_into(model, options) == {f"p{i}" for i in range(len(names))}
    assert not executor.leases()
    with pytest.raises(ValueError, match="not initialized"):
        plugin.load_into(_VllmStyleModel([*names, "missing.weight"]), options)
    assert not executor.leases()  # a failed load gives its lease back too
    with pytest.raises(ValueError, match="unknown prewarm loader options"):
        plugin.LoaderOptions.from_config({"sha": "x"}, "/m")


def test_vllm_plugin_registers_its_load_format_through_vllms_documented_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM pins its own torch and cannot be installed beside ours: a stand-in with the two names the
    # plugin uses, as vLLM documents them (register_model_loader(format)(cls), BaseModelLoader).
    registered: dict[str, type] = {}

    class BaseModelLoader:
        def __init__(self, load_config: Any) -> None:
            self.load_config = load_config

    def register_model_loader(load_format: str) -> Any:
        def wrap(cls: type) -> type:
            assert issubclass(cls, BaseModelLoader)
            registered[load_format] = cls
            return cls

        return wrap

    loader_module = types.ModuleType("vllm.model_executor.model_loader")
    loader_module.BaseModelLoader = BaseModelLoader  # type: ignore[attr-defined]
    loader_module.register_model_loader = register_model_loader  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.model_executor"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader", loader_module)
    monkeypatch.setattr(plugin, "_loader", None)
    plugin.register()
    loader = registered["prewarm"](types.SimpleNamespace(model_loader_extra_config={"model_id": "x"}))
    assert loader.download_model(None) is None


def test_vllm_plugin_is_declared_as_a_general_plugin_entry_point() -> None:
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "prewarm"]
    assert entry.value == "prewarm_client.vllm:register"
    assert entry.load() is plugin.register
