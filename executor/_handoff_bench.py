"""``prewarm bench handoff``: an engine process starting from disk against the same engine taking the
same model from prewarm's L1 over the hand-off socket, in the same run.

One sharded checkpoint (Hugging Face layout, bf16) is synthesized and brought into this process's
executor: L3 (a ``file://`` directory) → L2 (the verified L2 directory) → L1 (the shared block), with
the hand-off socket served. Then, ``repeat`` times, alternating:

- ``engine_from_disk_s``: a fresh engine process reads every shard from the L2 directory with
  ``safetensors.torch.load_file(..., device=...)``, after the shards' pages were dropped from the page
  cache (``posix_fadvise(DONTNEED)`` on each file: cold, as after a reboot or under memory pressure);
- ``engine_from_l1_s``: a fresh engine process calls ``prewarm_client.open_weights(..., device=...)``.

Each timer starts in the engine after it has imported torch (and the loader's modules, and initialised
CUDA on a CUDA device) and stops when every tensor is usable on the target device (on CPU: the shared
block is mapped with its page tables filled, every tensor a view of it; on CUDA: copied and
synchronised). ``engine_read_bytes_from_*`` are the engine's own ``/proc/self/io`` ``read_bytes``
over its timed part. ``identical``: both engines computed the same digest over every tensor's bytes
(after their timers). On CUDA the executor holds L1 pinned and L0 on the same device, and two more
engines run after those: ``engine_from_l0_s``, a fresh engine process taking the model from the
executor's L0 over CUDA IPC in share mode (it maps the executor's memory: no copy), and
``engine_from_l0_copy_s``, the same in copy mode (one device-to-device copy, then the executor frees its
copy; L0 is loaded again before each run). Both are null on cpu. ``pinned_copy_s`` is one ``copy_`` of
a pinned buffer of the same size, the link's limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from executor._executor import Executor
from executor._handoff import HandoffServer
from models import Catalog, ModelSpec, shape_for_size, synth_checkpoint
from prewarm import Settings, Tier

__all__ = ["run_handoff_benchmark"]

ENGINE = """
    import hashlib, json, sys, time
    import torch
    from safetensors.torch import load_file
    from prewarm_client import checkpoint_files, open_weights

    mode, where, device, model, l0_mode = sys.argv[1:6]
    if device.startswith("cuda"):
        torch.empty(1, device=device)  # the CUDA context is not part of either load
        torch.cuda.synchronize()

    def read_bytes():
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))

    before, start = read_bytes(), time.perf_counter()
    if mode == "disk":
        tensors = {}
        for path in checkpoint_files(__import__("pathlib").Path(where)):
            tensors.update(load_file(str(path), device=device))
        handle = None
    else:
        handle = open_weights(model, socket_dir=where, device=device, mode=None if mode == "l1" else l0_mode)
        tensors = dict(handle)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds, read = time.perf_counter() - start, read_bytes() - before
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    if handle is not None:
        handle.close()
    report = {"seconds": seconds, "read_bytes": read, "digest": digest.hexdigest(), "n": len(tensors)}
    print(json.dumps(report))
"""


def _drop_pages(paths: list[Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _engine(mode: str, where: Path, device: str, model: str, l0_mode: str = "share") -> dict[str, Any]:
    import prewarm_client

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    # The engine imports prewarm_client only; it must find it where this process did.
    root = str(Path(prewarm_client.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ENGINE), mode, str(where), device, model, l0_mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"engine ({mode}) failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _checkpoint(work_dir: Path, nbytes: int, progress: Callable[[str], None]) -> ModelSpec:
    """Write the checkpoint once; a second run with the same size reuses it (and its entry)."""
    directory, stamp = work_dir / "l3" / "bench", work_dir / "l3" / "bench.entry.json"
    if stamp.exists():
        spec = ModelSpec.model_validate_json(stamp.read_text())
        if abs(spec.size_bytes - nbytes) < nbytes * 0.1 and directory.is_dir():
            return spec
    shutil.rmtree(directory, ignore_errors=True)
    progress(f"writing a {nbytes / 2**30:.2f} GiB sharded checkpoint to {directory}")
    spec = synth_checkpoint(
        directory, model_id="bench", shape=shape_for_size(nbytes, 2), shards=4, dtype="BF16", seed=7
    )
    stamp.write_text(spec.model_dump_json())
    return spec


def _pinned_copy_s(nbytes: int, device: str) -> float:
    source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target.copy_(source, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    target.copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def run_handoff_benchmark(
    settings: Settings,
    *,
    nbytes: int,
    device: str,
    work_dir: Path,
    repeat: int = 1,
    keep: bool = False,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """The figures of the module docstring; each is the best of ``repeat`` runs, ``samples`` all."""
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    spec = _checkpoint(work_dir, nbytes, progress)
    room = spec.size_bytes + 64 * 2**20
    cuda = device.startswith("cuda")
    exec_settings = settings.executor.model_copy(
        update={
            "l2_budget_bytes": max(settings.executor.l2_budget_bytes, 2 * room),
            "l1_budget_bytes": room,
            # On cpu the executor's L0 plays no part (engines take L1); on CUDA it is the L0 hand-off.
            "l0_budget": float(room if cuda else 2**20),
            "l0_reserve_bytes": 0,
            "l0_gpus": None,
            "device": device if cuda else "cpu",
        }
    )
    cache = work_dir / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    sockets = Path(tempfile.mkdtemp(prefix="prewarm-bench-"))
    report: dict[str, Any] = {"file_bytes": spec.size_bytes, "device": device, "repeat": repeat}
    samples: dict[str, list[float]] = {"engine_from_disk_s": [], "engine_from_l1_s": []}
    if cuda:
        samples |= {"engine_from_l0_s": [], "engine_from_l0_copy_s": []}
    digests: set[str] = set()
    read: dict[str, int] = {}
    try:
        with Executor(
            Catalog([spec]), settings, executor=exec_settings, cache_dir=cache, device=exec_settings.device
        ) as executor:
            executor.ensure("bench", Tier.L2)
            obj = executor.l2.lookup(spec.sha256 or "")
            assert obj is not None
            l2_dir = obj.directory
            shards = [path for rel, path, _size in obj.files() if rel.endswith(".safetensors")]
            report["executor_l2_to_l1_s"] = executor.ensure("bench", Tier.L1).seconds_per_hop.get("L2->L1")
            with HandoffServer(executor, sockets / "sock"):
                for rep in range(repeat):
                    progress(f"run {rep + 1}/{repeat}: engine from a cold L2 directory")
                    _drop_pages(shards)
                    disk = _engine("disk", l2_dir, device, "bench")
                    progress(f"run {rep + 1}/{repeat}: engine from L1 over the hand-off socket")
                    l1 = _engine("l1", sockets / "sock", device, "bench")
                    samples["engine_from_disk_s"].append(disk["seconds"])
                    samples["engine_from_l1_s"].append(l1["seconds"])
                    read["disk"] = max(read.get("disk", 0), disk["read_bytes"])
                    read["l1"] = max(read.get("l1", 0), l1["read_bytes"])
                    digests.update({disk["digest"], l1["digest"]})
                    for l0_mode in ("share", "copy") if cuda else ():
                        executor.ensure("bench", Tier.L0)  # a copy-mode run freed it
                        progress(f"run {rep + 1}/{repeat}: engine from L0 over CUDA IPC ({l0_mode})")
                        l0 = _engine("l0", sockets / "sock", device, "bench", l0_mode)
                        key = "engine_from_l0_s" if l0_mode == "share" else "engine_from_l0_copy_s"
                        samples[key].append(l0["seconds"])
                        read[f"l0_{l0_mode}"] = max(read.get(f"l0_{l0_mode}", 0), l0["read_bytes"])
                        digests.add(l0["digest"])
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        if not keep:
            shutil.rmtree(work_dir / "l3", ignore_errors=True)
    disk_s, l1_s = min(samples["engine_from_disk_s"]), min(samples["engine_from_l1_s"])
    report.update(
        {
            "engine_from_disk_s": disk_s,
            "engine_from_l1_s": l1_s,
            "engine_from_l0_s": min(samples["engine_from_l0_s"]) if cuda else None,
            "engine_from_l0_copy_s": min(samples["engine_from_l0_copy_s"]) if cuda else None,
            "engine_read_bytes_from_l0": read.get("l0_share") if cuda else None,
            "target_l0_under_1s": min(samples["engine_from_l0_s"]) < 1.0 if cuda else None,
            "engine_read_bytes_from_disk": read["disk"],
            "engine_read_bytes_from_l1": read["l1"],
            "identical": len(digests) == 1,
            "l1_speedup_over_disk": disk_s / l1_s if l1_s > 0 else None,
            "target_l1_3x_disk": l1_s * 3 <= disk_s,
            "pinned_copy_s": _pinned_copy_s(spec.size_bytes, device) if cuda else None,
            "samples": samples,
        }
    )
    if cuda:
        # The target: L1 -> engine at >= 0.9 x the link's rate (a pinned copy_ of the same bytes).
        report["l1_rate_vs_pinned_copy"] = report["pinned_copy_s"] / l1_s if l1_s > 0 else None
        report["target_l1_09_pinned_copy"] = (report["l1_rate_vs_pinned_copy"] or 0) >= 0.9
    return report
