"""L3 on the real S3 server of the local stack: loads (single files and checkpoint prefixes), a server that
dies mid-download, bad credentials."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch
from executor_testkit import SMALL, ExecutorFactory, make_model, s3_settings, serves
from safetensors.torch import load_file
from typer.testing import CliRunner

from executor import FileStore, S3Store, open_store
from models import Catalog, ModelSpec, synth_checkpoint
from prewarm import ObjectStoreError, Tier


class KillableProxy:
    """A TCP proxy in front of the S3 server that can die mid-transfer and come back on the same port.

    The shared S3 server must not be killed; cutting every connection and refusing new ones is what a
    client sees when a server dies, so this stands in for it.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.kill_after_bytes: int | None = None
        self.sent = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def kill(self) -> None:
        with self._lock:
            if self._listener is not None:
                with contextlib.suppress(OSError):  # close alone leaves the accepting thread blocked
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if downstream:
                    with self._lock:
                        self.sent += len(data)
                        dying = self.kill_after_bytes is not None and self.sent >= self.kill_after_bytes
                    if dying:
                        self.kill()
                        return
        except OSError:
            pass


@pytest.fixture
def uploaded(s3_endpoint: str, s3_bucket: str, weights_dir: Path, unique: str) -> ModelSpec:
    spec = make_model(weights_dir, "s3m", seed=11, layers=8)
    store = S3Store(s3_settings(s3_endpoint=s3_endpoint))
    store.ensure_bucket(s3_bucket)
    uri = f"s3://{s3_bucket}/executor-tests/{unique}/s3m.safetensors"
    store.put_file(FileStore.path(spec.uri), uri)
    return spec.model_copy(update={"uri": uri})


def test_store_reports_size_and_sha256_like_the_catalog(uploaded: ModelSpec, s3_endpoint: str) -> None:
    store = open_store(uploaded.uri, s3_settings(s3_endpoint=s3_endpoint))
    assert store.size(uploaded.uri) == uploaded.size_bytes
    assert store.sha256(uploaded.uri) == uploaded.sha256


@pytest.mark.parametrize("structure", ["cuda", "cpu-direct"])
def test_load_from_s3_streams_to_l0_and_l2_in_one_pass(
    uploaded: ModelSpec, s3_endpoint: str, weights_dir: Path, make_executor: ExecutorFactory, structure: str
) -> None:
    executor = make_executor(
        Catalog([uploaded]),
        s3=s3_settings(s3_endpoint=s3_endpoint),
        direct_l0=structure == "cpu-direct",  # "cuda": through L1, device copies per part
    )
    result = executor.ensure("s3m", Tier.L0)
    assert result.served_from is Tier.L3
    assert set(result.seconds_per_hop) == {"L3->L0"}
    assert serves(executor, uploaded, weights_dir / "s3m-v1.safetensors")
    assert executor.verify()[0].ok


@pytest.mark.parametrize(
    ("target", "structure"), [(Tier.L1, "cpu-direct"), (Tier.L0, "cuda"), (Tier.L0, "cpu-direct")]
)
def test_s3_server_killed_mid_download_leaves_no_partial_file_and_load_succeeds_after(
    uploaded: ModelSpec,
    s3_endpoint: str,
    weights_dir: Path,
    make_executor: ExecutorFactory,
    target: Tier,
    structure: str,
) -> None:
    parsed = urlparse(s3_endpoint)
    proxy = KillableProxy((parsed.hostname or "127.0.0.1", parsed.port or 80))
    proxy.kill_after_bytes = uploaded.size_bytes // 2
    s3 = s3_settings(s3_endpoint=proxy.url, s3_part_bytes=128 * 1024, s3_max_attempts=2)
    # "cuda": L1 and L0 both reserved for the download.
    executor = make_executor(Catalog([uploaded]), s3=s3, direct_l0=structure == "cpu-direct")

    with pytest.raises(ObjectStoreError) as err:
        executor.ensure("s3m", target)

    assert proxy.url in str(err.value)
    objects = [p for p in (executor.l2.root / "objects").rglob("*") if p.is_file()]
    assert objects == []
    assert list((executor.l2.root / "tmp").iterdir()) == []
    assert all(t.used_bytes == 0 for t in executor.state().tiers)

    proxy.kill_after_bytes = None
    proxy.start()  # the server is back, on the same address
    try:
        result = executor.ensure("s3m", Tier.L0)
        assert result.served_from is Tier.L3
        assert serves(executor, uploaded, weights_dir / "s3m-v1.safetensors")
    finally:
        proxy.kill()


def test_missing_credentials_name_the_endpoint(
    uploaded: ModelSpec, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.startswith("AWS_") and "CHECKSUM" not in key:
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3Store(s3_settings(s3_endpoint=s3_endpoint))
    with pytest.raises(ObjectStoreError) as err:
        store.size(uploaded.uri)
    assert s3_endpoint.rstrip("/") in str(err.value)
    assert "credentials" in str(err.value)
    assert not err.value.transient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_endpoint_is_one_line_naming_it(
    tmp_path: Path, weights_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{_free_port()}"
    spec = make_model(weights_dir, "gone", seed=1).model_copy(update={"uri": "s3://bucket/gone.safetensors"})
    Catalog([spec]).save(tmp_path / "catalog.yaml")
    for key in list(os.environ):
        if key.startswith("PREWARM_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    from prewarm_cli import app

    result = CliRunner().invoke(
        app,
        [
            "--set", f"s3_endpoint={endpoint}",
            "--set", "s3_max_attempts=1",
            "executor", "load", "gone",
            "--catalog", str(tmp_path / "catalog.yaml"),
            "--cache-dir", str(tmp_path / "cache"),
            "--tier", "L2",
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert endpoint in lines[0]
    assert "unreachable" in lines[0]


def test_checkpoint_loads_from_an_s3_prefix_as_one_directory(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, unique: str, make_executor: ExecutorFactory
) -> None:
    root = tmp_path / "llama"
    local = synth_checkpoint(root, model_id="org/llama", shape=SMALL, shards=3)
    store = S3Store(s3_settings(s3_endpoint=s3_endpoint))
    store.ensure_bucket(s3_bucket)
    prefix = f"s3://{s3_bucket}/executor-tests/{unique}/org/llama/"
    for f in local.files:
        store.put_file(root / f.path, prefix + f.path)
    # The listing the register command builds the entry from, and the entry the executor loads.
    assert store.list_prefix(prefix) == [(f.path, f.size_bytes) for f in local.files]
    spec = local.model_copy(update={"uri": prefix})
    executor = make_executor(Catalog([spec]), s3=s3_settings(s3_endpoint=s3_endpoint))

    assert executor.ensure("org/llama", Tier.L0).served_from is Tier.L3

    assert spec.sha256 is not None
    obj = executor.l2.lookup(spec.sha256)
    assert obj is not None
    assert all(path.read_bytes() == (root / rel).read_bytes() for rel, path, _ in obj.files())
    expected = {k: v for f in spec.weight_files() for k, v in load_file(str(root / f.path)).items()}
    with executor.acquire("org/llama") as tensors:
        assert tensors.keys() == expected.keys()
        assert all(torch.equal(tensors[k], v) for k, v in expected.items())
