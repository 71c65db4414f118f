"""The executor's GPU check: ``python -m executor._gpucheck [--size 4GiB] [--json OUT]``.

Run by ``deploy/gpu/check_executor.sh`` on a bare GPU image (torch, safetensors, numpy; the few pure
packages prewarm needs besides are carried as wheels). In well under five minutes it checks that
tensors served from L0 equal what ``safetensors`` loads, then runs the load benchmark on the device and
compares each ratio with its target. Exit status 0 when every check and target holds, 1 otherwise; the
JSON report is written either way, so a miss still leaves its figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _differs(ex: Any, model_id: str, expected: dict[str, torch.Tensor], path: str) -> str | None:
    with ex.acquire(model_id) as tensors:
        for name, tensor in expected.items():
            if tensors[name].device != tensor.device:
                return f"{path}: {model_id}/{name} is on {tensors[name].device}, not {tensor.device}"
            if not torch.equal(tensors[name], tensor):
                return f"{path}: {model_id}/{name} differs from safetensors' copy"
    return None


def _correctness(device: str, work: Path) -> str | None:
    """Every device path once, each result compared with what ``safetensors`` loads onto the device:
    L3 → L0 in one pass, L2 → L0 through the pinned pool and through the staging ring (the bigger model
    does not fit L1 here), and a demotion to L2 from device memory."""
    from safetensors.torch import load_file

    from executor import Executor, FileStore
    from executor._bench import drop_page_cache
    from models import synth_catalog
    from prewarm import ExecutorSettings, S3Settings, Tier

    catalog = synth_catalog(work / "weights", [64 * 2**20, 16 * 2**20])
    settings = ExecutorSettings.model_construct(
        device=device,
        chunk_bytes=8 * 2**20,
        l1_budget_bytes=48 * 2**20,
        l0_budget=float(2**30),
        l0_reserve_bytes=0,
    )
    with Executor(
        catalog, executor=settings, s3=S3Settings.model_construct(), cache_dir=work / "cache"
    ) as ex:
        for spec in catalog:
            expected = load_file(str(FileStore.path(spec.uri)), device=device)

            ex.ensure(spec.id, Tier.L0)  # L3 -> L0: device copies of each part as it is hashed
            problem = _differs(ex, spec.id, expected, "L3->L0")
            ex.evict(spec.id, Tier.L1)  # L0 and L1 go, L2 stays
            drop_page_cache(ex.l2.object_path(spec.sha256 or ""))
            ex.ensure(spec.id, Tier.L0)  # L2 -> L0 on a side stream, through L1 or the staging ring
            problem = problem or _differs(ex, spec.id, expected, "L2->L0")
            ex._evict_one(spec.id, Tier.L2)
            ex._evict_one(spec.id, Tier.L1)
            if ex.ensure(spec.id, Tier.L2).served_from is not Tier.L0 or not all(r.ok for r in ex.verify()):
                problem = problem or f"L0->L2: {spec.id} was not written intact from device memory"
            if problem:
                return problem
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4GiB")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from executor._bench import run_load_benchmark
    from prewarm import load_settings, parse_bytes

    start = time.perf_counter()
    work = args.dir or Path(tempfile.mkdtemp(prefix="prewarm-gpucheck-"))
    problem = _correctness(args.device, work / "correctness")
    report = run_load_benchmark(
        load_settings(),
        nbytes=parse_bytes(args.size),
        device=args.device,
        work_dir=work / "bench",
        bucket=None,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    report["torch"] = torch.__version__
    report["gpu"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    misses = [problem] if problem else []
    for name, target in report["targets"].items():
        got = report["ratios"].get(name)
        if got is not None and got < target:
            misses.append(f"{name} = {got} < target {target}")
    report["correctness"] = problem or "ok"
    report["misses"] = misses
    report["seconds"] = round(time.perf_counter() - start, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    for miss in misses:
        print(f"MISS: {miss}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
