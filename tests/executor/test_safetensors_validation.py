"""Crafted safetensors headers are rejected before anything is allocated; good ones become views."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from executor_testkit import make_model
from safetensors.torch import load_file

from executor import parse_header, tensor_views
from executor._safetensors import MAX_HEADER_BYTES, header_length
from models import Catalog, ModelSpec
from prewarm import InvalidWeights, Tier


def _file(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _parse(blob: bytes) -> None:
    n = header_length(blob[:8], len(blob))
    parse_header(blob[8 : 8 + n], len(blob))


def _entry(dtype: str, shape: list[int], start: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


def test_huge_header_length_is_rejected_from_the_prefix_alone() -> None:
    with pytest.raises(InvalidWeights) as err:
        header_length(struct.pack("<Q", 2**62), 2**40)
    assert err.value.reason == "header_too_large"
    with pytest.raises(InvalidWeights):
        header_length(struct.pack("<Q", MAX_HEADER_BYTES + 1), 2**40)


def test_header_length_past_end_of_file_is_rejected() -> None:
    with pytest.raises(InvalidWeights, match="past the end"):
        header_length(struct.pack("<Q", 1000), 100)


@pytest.mark.parametrize(
    ("tensors", "reason"),
    [
        ({"a": _entry("F16", [2], 0, 4), "b": _entry("F16", [2], 2, 6)}, "bad_offsets"),  # overlap
        ({"a": _entry("F16", [2], 0, 4), "b": _entry("F16", [2], 6, 10)}, "bad_offsets"),  # gap
        ({"a": _entry("F16", [4], 0, 8), "b": _entry("F16", [4], 8, 16)}, "bad_offsets"),  # past data
        ({"a": _entry("Q4_K", [2], 0, 4)}, "unknown_dtype"),
        ({"a": _entry("F16", [3], 0, 4)}, "bad_offsets"),  # shape does not match the byte count
        ({"a": _entry("F16", [-1], 0, 4)}, "bad_header"),
        ({"a": {"dtype": "F16", "shape": [2]}}, "bad_header"),
        ({"a": _entry("F16", [1], 0, 2)}, "size_mismatch"),  # data left over at the end
    ],
)
def test_crafted_header_is_rejected(tensors: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidWeights) as err:
        _parse(_file(tensors, b"\0" * 8))
    assert err.value.reason == reason


def test_header_that_is_not_a_json_object_is_rejected() -> None:
    for body in (b"[1, 2]", b"{not json", b"\xff\xfe"):
        blob = struct.pack("<Q", len(body)) + body
        with pytest.raises(InvalidWeights):
            _parse(blob)


def test_views_match_what_safetensors_loads(weights_dir: Path) -> None:
    spec = make_model(weights_dir, "v", seed=3)
    path = weights_dir / "v-v1.safetensors"
    blob = path.read_bytes()
    n = header_length(blob[:8], len(blob))
    layout = parse_header(blob[8 : 8 + n], len(blob))
    buffer = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    views = tensor_views(buffer, layout)
    expected = load_file(str(path))
    assert views.keys() == expected.keys()
    for name, tensor in expected.items():
        assert views[name].dtype == tensor.dtype
        assert views[name].shape == tensor.shape
        assert torch.equal(views[name], tensor)
        # A view of the one buffer, not a copy.
        assert views[name].untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    assert spec.size_bytes == len(blob)


def test_crafted_file_in_l3_is_rejected_before_any_tier_allocates(
    tmp_path: Path, make_executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "evil.safetensors"
    blob = _file({"a": _entry("F16", [2], 0, 4), "b": _entry("F16", [2], 2, 6)}, b"\0" * 6)
    path.write_bytes(blob)
    spec = ModelSpec(id="evil", version="1", uri=path.as_uri(), size_bytes=len(blob), sha256="0" * 64)
    executor = make_executor(Catalog([spec]))
    allocations: list[int] = []
    real_alloc = executor.l1.pool.alloc
    monkeypatch.setattr(executor.l1.pool, "alloc", lambda n: allocations.append(n) or real_alloc(n))
    with pytest.raises(InvalidWeights):
        executor.ensure("evil", Tier.L0)
    assert allocations == []
    state = executor.state()
    assert all(t.used_bytes == 0 and not t.resident for t in state.tiers)
    assert not list((executor.l2.root / "tmp").iterdir())
