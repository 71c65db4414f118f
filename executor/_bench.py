"""``prewarm bench load``: the loader's rates against the disk's limit and the usual loaders, same run.

On one synthetic safetensors file (a transformer layout, fp16), with the page cache dropped before
every cold measurement where the kernel allows it (``/proc/sys/vm/drop_caches`` needs root; otherwise
``posix_fadvise(DONTNEED)`` on the file, which evicts its clean pages just as well):

- ``raw_read``: one thread, O_DIRECT, 64 MiB sequential reads: what the disk gives.
- ``baseline_safetensors``: ``safetensors.torch.load_file(path, device=...)``, every tensor materialised.
- ``l2_to_l1``, ``l1_to_l0``, ``l2_to_l0`` (cold, overlapped): ``Executor.ensure`` as the node runs it.
- ``s3_baseline``: boto3 ``download_file`` to disk with the same part size and concurrency (and
  ``s3_baseline_fsync``: the same followed by ``fsync``, durable like every L2 write);
  ``l3_to_l1``: ``Executor.ensure(L1)`` from S3 (sha256 verified, L2 written in the same pass). Both
  ``null`` without an S3 endpoint and ``--bucket``.
- on CUDA, ``pinned_copy``: one plain ``copy_`` of a pinned buffer of the same size, the H2D limit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from executor._executor import Executor
from executor._hostmem import host_buffer, populate
from executor._pipeline import host_view
from executor._tier import round_up
from models import Catalog, ModelSpec, shape_for_size, write_safetensors
from prewarm import Settings, Tier

__all__ = ["drop_page_cache", "raw_read_bytes_per_s", "run_load_benchmark"]

_RAW_BLOCK = 64 * 2**20


def drop_page_cache(*paths: Path) -> str | None:
    """Evict ``paths`` from the page cache; returns how (``drop_caches``, ``fadvise``) or None."""
    os.sync()
    with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
        return "drop_caches"
    done = None
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                done = "fadvise"
            finally:
                os.close(fd)
    return done


def raw_read_bytes_per_s(path: Path) -> tuple[float, bool]:
    """Sequential read of the whole file in 64 MiB blocks, O_DIRECT when allowed; (rate, direct)."""
    # The same memory the executor reads into (page-aligned, huge pages, resident), so the baseline is
    # the disk's limit and not the limit of a buffer's page layout.
    buffer = host_buffer(_RAW_BLOCK)
    populate(buffer)
    view, _address = host_view(buffer)
    direct = True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        fd, direct = os.open(path, os.O_RDONLY), False
    try:
        size = os.fstat(fd).st_size
        start = time.perf_counter()
        offset = 0
        while offset < size:
            n = os.preadv(fd, [view], offset)
            if n <= 0:
                break
            offset += n
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return size / elapsed, direct


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _synthesize(path: Path, nbytes: int, progress: Callable[[str], None]) -> str:
    """Write the file once; a second run with the same size reuses it (and its recorded sha256)."""
    stamp = path.with_suffix(".sha256")
    if path.exists() and stamp.exists():
        recorded_size, _, sha = stamp.read_text().partition(" ")
        if int(recorded_size) == path.stat().st_size and abs(int(recorded_size) - nbytes) < nbytes * 0.1:
            return sha.strip()
    progress(f"writing a {nbytes / 2**30:.2f} GiB safetensors file to {path}")
    sha = write_safetensors(path, shape_for_size(nbytes))
    stamp.write_text(f"{path.stat().st_size} {sha}")
    return sha


def run_load_benchmark(
    settings: Settings,
    *,
    nbytes: int,
    device: str,
    work_dir: Path,
    bucket: str | None,
    repeat: int = 1,
    keep: bool = False,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Every figure ``repeat`` times, the measurements interleaved so that a noisy neighbour hurts all
    of them alike; each key reports the best rate, ``samples`` all of them."""
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "bench.safetensors"
    sha = _synthesize(path, nbytes, progress)
    size = path.stat().st_size
    spec = ModelSpec(id="bench", version="1", uri=path.as_uri(), size_bytes=size, sha256=sha)
    report: dict[str, Any] = {"file_bytes": size, "device": device, "repeat": repeat}
    method = drop_page_cache(path)
    report["page_cache_dropped"] = method is not None
    report["page_cache_method"] = method
    progress(f"page cache dropped: {method or 'no'}")

    room = round_up(size) + 2**20
    exec_settings = settings.executor.model_copy(
        update={
            "l2_budget_bytes": max(settings.executor.l2_budget_bytes, 2 * room),
            "l1_budget_bytes": room,
            "l0_budget": float(room),
            "l0_reserve_bytes": 0,
        }
    )
    cache = work_dir / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    s3 = _S3Bench.create(settings, spec, path, work_dir, exec_settings, device, bucket, progress)
    samples: dict[str, list[float]] = defaultdict(list)
    executor = Executor(
        Catalog([spec]), executor=exec_settings, s3=settings.s3, cache_dir=cache, device=device
    )
    try:
        executor.ensure("bench", Tier.L2)  # file:// L3 → L2: the cache entry the next runs read
        # Each L1 block is a fresh memfd (shared with engines), so its page faults are part of every
        # load to L1 and are counted (the pool used to be one allocation, touched once up front).
        obj_path = executor.l2.object_path(sha)
        for rep in range(repeat):
            drop_page_cache(path)
            raw, report["raw_read_o_direct"] = raw_read_bytes_per_s(path)
            samples["raw_read_bytes_per_s"].append(raw)
            samples["baseline_safetensors_bytes_per_s"].append(_safetensors_rate(path, size, device))

            executor.evict("bench", Tier.L1)
            drop_page_cache(obj_path)
            r = executor.ensure("bench", Tier.L1, demand=True)
            samples["l2_to_l1_bytes_per_s"].append(size / r.seconds_per_hop["L2->L1"])
            r = executor.ensure("bench", Tier.L0, demand=True)
            samples["l1_to_l0_bytes_per_s"].append(size / r.seconds_per_hop["L1->L0"])
            executor.evict("bench", Tier.L1)
            drop_page_cache(obj_path)
            r = executor.ensure("bench", Tier.L0, demand=True)
            samples["l2_to_l0_bytes_per_s"].append(size / r.seconds_per_hop["L2->L0"])
            if device.startswith("cuda"):
                samples["pinned_copy_bytes_per_s"].append(_pinned_copy(size))
            if s3 is not None:
                for key, value in s3.measure().items():
                    samples[key].append(value)
            progress(
                f"run {rep + 1}/{repeat}: "
                + ", ".join(f"{k.removesuffix('_bytes_per_s')} {v[-1] / 1e9:.2f}" for k, v in samples.items())
                + " GB/s"
            )
    finally:
        executor.close()
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)
    report["l2_read_o_direct"] = exec_settings.l2_direct_io
    for key in (
        "raw_read_bytes_per_s",
        "baseline_safetensors_bytes_per_s",
        "l2_to_l1_bytes_per_s",
        "l1_to_l0_bytes_per_s",
        "l2_to_l0_bytes_per_s",
        "pinned_copy_bytes_per_s",
        "s3_baseline_bytes_per_s",
        "s3_baseline_fsync_bytes_per_s",
        "l3_to_l1_bytes_per_s",
    ):
        report[key] = max(samples[key]) if samples.get(key) else None
    report["samples"] = {k: [round(v) for v in vs] for k, vs in samples.items()}
    report.update(_ratios(report))
    return report


def _safetensors_rate(path: Path, size: int, device: str) -> float:
    from safetensors.torch import load_file

    drop_page_cache(path)
    start = time.perf_counter()
    tensors = load_file(str(path), device=device)  # closes its mmap: every tensor owns its bytes
    _sync(device)
    elapsed = time.perf_counter() - start
    del tensors
    return size / elapsed


def _pinned_copy(size: int) -> float:
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)  # warm-up: context, allocator, DMA mappings
    torch.cuda.synchronize()
    start = time.perf_counter()
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return size / (time.perf_counter() - start)


class _S3Bench:
    """The L3 figures: boto3's download_file (alone and made durable) against Executor.ensure(L1)."""

    def __init__(
        self, settings: Settings, spec: ModelSpec, path: Path, work_dir: Path, exec_settings: Any, device: str
    ) -> None:
        from executor._stores import S3Store

        self.settings, self.path, self.work_dir = settings, path, work_dir
        self.exec_settings, self.device = exec_settings, device
        self.store = S3Store(settings.s3)
        self.spec = spec

    @classmethod
    def create(
        cls,
        settings: Settings,
        spec: ModelSpec,
        path: Path,
        work_dir: Path,
        exec_settings: Any,
        device: str,
        bucket: str | None,
        progress: Callable[[str], None],
    ) -> _S3Bench | None:
        if settings.s3.s3_endpoint is None or not bucket:
            progress("S3 figures skipped: no PREWARM_S3_ENDPOINT or no --bucket")
            return None
        bench = cls(settings, spec, path, work_dir, exec_settings, device)
        uri = f"s3://{bucket}/bench/{spec.sha256}.safetensors"
        bench.store.ensure_bucket(bucket)
        progress(f"uploading to {uri}")
        bench.store.put_file(path, uri)
        bench.spec = spec.model_copy(update={"uri": uri})
        return bench

    def _download(self, *, durable: bool) -> float:
        target = self.work_dir / "download.bin"
        s3 = self.settings.s3
        drop_page_cache(self.path)
        start = time.perf_counter()
        self.store.download_file(
            self.spec.uri, target, part_bytes=s3.s3_part_bytes, concurrency=s3.s3_concurrency
        )
        if durable:
            # Durable like every L2 write: download_file alone may return with gigabytes still dirty in
            # the page cache, which flatters it on a slow disk.
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elapsed = time.perf_counter() - start
        target.unlink(missing_ok=True)
        return self.spec.size_bytes / elapsed

    def measure(self) -> dict[str, float]:
        baseline = self._download(durable=False)
        durable = self._download(durable=True)
        cache = self.work_dir / "cache-s3"
        shutil.rmtree(cache, ignore_errors=True)
        with Executor(
            Catalog([self.spec]),
            executor=self.exec_settings,
            s3=self.settings.s3,
            cache_dir=cache,
            device=self.device,
        ) as executor:
            result = executor.ensure("bench", Tier.L1, demand=True)
        shutil.rmtree(cache, ignore_errors=True)
        return {
            "s3_baseline_bytes_per_s": baseline,
            "s3_baseline_fsync_bytes_per_s": durable,
            "l3_to_l1_bytes_per_s": self.spec.size_bytes / result.seconds_per_hop["L3->L1"],
        }


_RATIOS = {
    "l2_to_l1_vs_raw_read": ("l2_to_l1_bytes_per_s", "raw_read_bytes_per_s"),
    "l2_to_l0_vs_safetensors": ("l2_to_l0_bytes_per_s", "baseline_safetensors_bytes_per_s"),
    "l3_to_l1_vs_download_file": ("l3_to_l1_bytes_per_s", "s3_baseline_bytes_per_s"),
    "l3_to_l1_vs_download_file_fsync": ("l3_to_l1_bytes_per_s", "s3_baseline_fsync_bytes_per_s"),
    "l1_to_l0_vs_pinned_copy": ("l1_to_l0_bytes_per_s", "pinned_copy_bytes_per_s"),
}


def _ratios(report: dict[str, Any]) -> dict[str, Any]:
    """Best against best (``ratios``), and run by run (``ratios_per_run``: the two figures of one run
    were measured minutes apart at most, so a noisy neighbour weighs on both)."""

    def ratio(a: str, b: str) -> float | None:
        x, y = report.get(a), report.get(b)
        return round(x / y, 3) if x and y else None

    samples = report.get("samples", {})
    return {
        "ratios": {name: ratio(a, b) for name, (a, b) in _RATIOS.items()},
        "ratios_per_run": {
            name: [round(x / y, 3) for x, y in zip(samples[a], samples[b], strict=True)]
            for name, (a, b) in _RATIOS.items()
            if samples.get(a) and samples.get(b)
        },
        "targets": {
            "l2_to_l1_vs_raw_read": 0.85,
            "l2_to_l0_vs_safetensors": 1.5,
            "l3_to_l1_vs_download_file": 1.0,
            "l1_to_l0_vs_pinned_copy": 0.9,
        },
    }
