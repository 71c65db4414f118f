"""The hand-off's GPU check: ``python -m executor._gpucheck_ipc [--device D] [--size 256MiB] [--json OUT]``.

Run by ``deploy/gpu/check_executor.sh`` after the loader's check. Every engine below is a separate
process that imports ``prewarm_client`` only (``ENGINE``); every tensor it gets is compared, by digest,
with what ``safetensors`` reads from the checkpoint's files. The checks, each with its figures:

- ``placement``: per-GPU L0 on the machine's GPUs: a copy goes to the GPU an order names, the report's
  per-GPU used bytes sum to L0's, two models that cannot share a GPU go to two (with two GPUs);
- ``shards``: a model larger than one GPU's budget held as two shards, on two GPUs when the machine
  has them, else on two virtual GPUs of one device (the same allocations, per-device copies and
  handles), served equal, and demoted L0 -> L2 from both shards intact;
- ``l1_engine``: an engine takes the weights from the executor's pinned shared L1 onto the GPU;
- ``ipc_share``: an engine maps the L0 copy over CUDA IPC (no allocation of its own); while it holds
  the lease an evict order leaves the copy; when it exits the lease ends;
- ``ipc_copy``: an engine clones the copy; the executor's copy leaves L0 and its memory goes back to the
  device (``memory_reserved`` drops by the model's size);
- ``ipc_ranks``: each rank of the two-shard model maps its own shard: disjoint, together every tensor.

On a machine without CUDA the checks that need none run on the cpu stand-in and the IPC checks record
the cpu executor's refusal (reason ``mode``), so the script itself is exercised anywhere. Exit status 0
when every check holds; the JSON report is written either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ENGINE = """
    import hashlib, json, sys, time
    import torch
    from prewarm_client import Refused, open_weights

    socket_dir, model, device, mode, rank, hold = sys.argv[1:7]
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    if cuda:
        torch.empty(1, device=device)  # the CUDA context is not part of the hand-off
        torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated() if cuda else 0
    start = time.perf_counter()
    try:
        weights = open_weights(model, socket_dir=socket_dir, device=device,
                               mode=None if mode == "l1" else mode,
                               rank=None if rank == "-" else int(rank))
    except Refused as exc:
        print(json.dumps({"refused": exc.reason, "error": str(exc)}), flush=True)
        sys.exit(0)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    digests = {}
    for name in sorted(weights):
        t = weights[name]
        digests[name] = hashlib.blake2b(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes(),
                                        digest_size=16).hexdigest()
    report = {"seconds": seconds, "digests": digests, "source": weights.source, "leased": weights.leased,
              "devices": sorted({str(t.device) for t in weights.values()}),
              "allocated": (torch.cuda.memory_allocated() - allocated) if cuda else 0}
    print(json.dumps(report), flush=True)
    if hold == "1":
        sys.stdin.readline()
    weights.close()
"""


def _digests(directory: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    out: dict[str, str] = {}
    for path in sorted(directory.glob("*.safetensors")):
        for name, tensor in load_file(str(path)).items():
            data = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            out[name] = hashlib.blake2b(data, digest_size=16).hexdigest()
    return out


def _engine(socket_dir: Path, model: str, device: str, mode: str, rank: int | None = None) -> dict[str, Any]:
    done = subprocess.run(
        _engine_command(socket_dir, model, device, mode, rank, hold=False),
        env=_engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"engine ({mode}) failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _engine_command(
    socket_dir: Path, model: str, device: str, mode: str, rank: int | None, *, hold: bool
) -> list[str]:
    rank_arg = "-" if rank is None else str(rank)
    args = [str(socket_dir), model, device, mode, rank_arg, "1" if hold else "0"]
    return [sys.executable, "-c", textwrap.dedent(ENGINE), *args]


def _engine_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _wait(predicate: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _in_l0(executor: Any, model: str) -> Any:
    from prewarm import Tier

    tier = executor.state().tier(Tier.L0)
    return next((r for r in tier.resident if r.model == model), None)


def _per_gpu_sums(executor: Any) -> bool:
    from prewarm import Tier

    state = executor.state()
    l0 = state.tier(Tier.L0)
    return bool(sum(g.used_bytes for g in state.gpus) == l0.used_bytes)


def _equal(executor: Any, model: str, expected: dict[str, str]) -> bool:
    with executor.acquire(model) as tensors:
        got = {
            n: hashlib.blake2b(
                t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes(), digest_size=16
            ).hexdigest()
            for n, t in tensors.items()
        }
    return got == expected


def check_placement(device: str, work: Path, models: dict[str, Any]) -> dict[str, Any]:
    from executor._executor import Executor
    from models import Catalog
    from prewarm import ExecutorSettings, S3Settings, Tier

    gpus = torch.cuda.device_count() if device.startswith("cuda") else 2
    size = max(spec.size_bytes for spec, _ in models.values())
    settings = ExecutorSettings.model_construct(
        device=device, l0_budget=float(size * 3 // 2), l0_reserve_bytes=0, l1_budget_bytes=4 * size,
        l0_gpus=None if device.startswith("cuda") else gpus,
    )  # fmt: skip
    catalog = Catalog([spec for spec, _ in models.values()])
    with Executor(catalog, executor=settings, s3=S3Settings.model_construct(), cache_dir=work / "p") as ex:
        last = gpus - 1
        ex.ensure("a", Tier.L0, gpus=[last])
        report: dict[str, Any] = {
            "gpus": [g.model_dump() for g in ex.state().gpus],
            "order_gpu_honoured": _in_l0(ex, "a").gpus == [last],
            "a_equal": _equal(ex, "a", models["a"][1]),
        }
        if gpus >= 2:
            ex.ensure("b", Tier.L0)
            report["two_models_two_gpus"] = sorted(_in_l0(ex, m).gpus[0] for m in "ab") == [0, last] or (
                _in_l0(ex, "b").gpus != _in_l0(ex, "a").gpus
            )
        report["per_gpu_sums_to_l0"] = _per_gpu_sums(ex)
    report["ok"] = all(v for k, v in report.items() if k != "gpus")
    return report


def check_hand_off(
    device: str, work: Path, models: dict[str, Any], checks: dict[str, dict[str, Any]]
) -> None:
    """The shard, L1-engine and IPC checks, on one executor holding model ``c`` as two shards; each
    check's figures go into ``checks`` as soon as it has run."""
    from executor._executor import Executor
    from executor._handoff import HandoffServer
    from models import Catalog
    from prewarm import ExecutorSettings, S3Settings, Tier

    cuda = device.startswith("cuda")
    spec, expected = models["c"]
    single, single_expected = models["d"]  # a single file: what L0 -> L2 demotes (checkpoints come from L3)
    devices = ["cuda:0", "cuda:1"] if cuda and torch.cuda.device_count() >= 2 else [device] * 2
    settings = ExecutorSettings.model_construct(
        device=device, l0_budget=float(spec.size_bytes * 6 // 10), l0_reserve_bytes=0,
        l1_budget_bytes=2 * spec.size_bytes,
    )  # fmt: skip
    sockets = Path(tempfile.mkdtemp(prefix="prewarm-gpucheck-ipc-")) / "sock"
    with (
        Executor(
            Catalog([spec, single]),
            executor=settings,
            s3=S3Settings.model_construct(),
            cache_dir=work / "h",
            l0_devices=devices,
        ) as ex,
        HandoffServer(ex, sockets),
    ):
        ex.ensure("d", Tier.L0)
        shards: dict[str, Any] = {"l0_devices": devices, "single_file_gpus": _in_l0(ex, "d").gpus}
        ex._evict_one("d", Tier.L1)  # L0 alone holds it now (``evict`` would drop L0 too)
        ex._evict_one("d", Tier.L2)
        demoted = ex.ensure("d", Tier.L2)  # written from both shards, verified like a download
        shards["demoted_from_l0"] = demoted.served_from is Tier.L0 and all(r.ok for r in ex.verify())
        shards["single_file_equal"] = _equal(ex, "d", single_expected)
        ex.evict("d", Tier.L0)
        ex.ensure("c", Tier.L0)
        held = _in_l0(ex, "c")
        shards |= {"gpus": held.gpus, "equal": _equal(ex, "c", expected)}
        shards["ok"] = (
            len(held.gpus) == 2
            and len(shards["single_file_gpus"]) == 2
            and shards["equal"]
            and shards["single_file_equal"]
            and shards["demoted_from_l0"]
        )
        checks["shards"] = shards

        ex.ensure("c", Tier.L1)
        block = ex.l1.cache.pin(spec.key)
        pinned = bool(block is not None and block.pinned)
        ex.l1.cache.unpin(spec.key)
        l1 = _engine(sockets, "c", "cuda:0" if cuda else "cpu", "l1")
        checks["l1_engine"] = {
            "seconds": l1["seconds"],
            "gb_per_s": spec.size_bytes / l1["seconds"] / 1e9,
            "block_pinned": pinned,
            "devices": l1["devices"],
            "ok": l1["digests"] == expected and (pinned or not cuda),
        }
        if not cuda:
            refused = _engine(sockets, "c", "cuda:0", "share")
            checks["ipc_refused_on_cpu"] = {**refused, "ok": refused.get("refused") == "mode"}
            return
        ex.ensure("c", Tier.L0)
        checks["ipc_share"] = _share(ex, sockets, spec.size_bytes, expected)
        checks["ipc_ranks"] = _ranks(sockets, expected)
        checks["ipc_copy"] = _copy(ex, sockets, spec.size_bytes, expected)


def _share(ex: Any, sockets: Path, size: int, expected: dict[str, str]) -> dict[str, Any]:
    from prewarm import Tier

    engine = subprocess.Popen(
        _engine_command(sockets, "c", "cuda:0", "share", None, hold=True),
        env=_engine_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert engine.stdin is not None
    assert engine.stdout is not None
    line = engine.stdout.readline()
    if not line:
        return {"ok": False, "error": engine.stderr.read()[-3000:] if engine.stderr else ""}
    got = json.loads(line)
    leases_while_held = _in_l0(ex, "c").leases
    ex.evict("c", Tier.L0)  # an order: the leased copy stays
    survived = _in_l0(ex, "c") is not None
    engine.stdin.write("\n")
    engine.stdin.flush()
    engine.wait(60)
    ended = _wait(lambda: (r := _in_l0(ex, "c")) is not None and r.leases == 0)
    return {
        "seconds": got["seconds"],
        "engine_allocated_bytes": got["allocated"],
        "leases_while_held": leases_while_held,
        "survived_evict_while_leased": survived,
        "lease_ended_with_engine": ended,
        "ok": got["digests"] == expected
        and got["allocated"] < size // 100  # mapped, not copied
        and leases_while_held == 1
        and survived
        and ended,
    }


def _ranks(sockets: Path, expected: dict[str, str]) -> dict[str, Any]:
    parts = [_engine(sockets, "c", "cuda:0", "share", rank) for rank in (0, 1)]
    names = [set(p["digests"]) for p in parts]
    merged = {**parts[0]["digests"], **parts[1]["digests"]}
    return {
        "tensors_per_rank": [len(n) for n in names],
        "devices": [p["devices"] for p in parts],
        "ok": names[0].isdisjoint(names[1]) and merged == expected,
    }


def _copy(ex: Any, sockets: Path, size: int, expected: dict[str, str]) -> dict[str, Any]:
    reserved = [torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count())]
    got = _engine(sockets, "c", "cuda:0", "copy")
    left = _wait(lambda: _in_l0(ex, "c") is None)
    torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]
    after = [torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count())]
    returned = sum(reserved) - sum(after)
    return {
        "seconds": got["seconds"],
        "engine_allocated_bytes": got["allocated"],
        "executor_copy_left_l0": left,
        "memory_returned_bytes": returned,
        "ok": got["digests"] == expected and got["leased"] is False and left and returned >= size * 9 // 10,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="256MiB", help="size of the two-shard model")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from models import ModelSpec, shape_for_size, synth_checkpoint, write_safetensors
    from prewarm import parse_bytes

    started = time.perf_counter()
    work = args.dir or Path(tempfile.mkdtemp(prefix="prewarm-gpucheck-ipc-"))
    models: dict[str, Any] = {}
    for name, nbytes, shards in (
        ("a", 16 * 2**20, 1),
        ("b", 16 * 2**20, 1),
        ("c", parse_bytes(args.size), 4),
    ):
        directory = work / "l3" / name
        shape = shape_for_size(nbytes, 2)
        spec = synth_checkpoint(directory, model_id=name, shape=shape, shards=shards, seed=ord(name))
        models[name] = (spec, _digests(directory))
    nbytes = parse_bytes(args.size) * 9 // 10  # too big for one GPU's budget, as ``c`` is
    path = work / "l3" / "d" / "d.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    sha = write_safetensors(path, shape_for_size(nbytes, 2), dtype="BF16", seed=4)
    single = ModelSpec(id="d", version="1", uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=sha)
    models["d"] = (single, _digests(path.parent))
    report: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "checks": {}}
    checks: dict[str, dict[str, Any]] = report["checks"]
    for name in ("placement", "hand_off"):
        try:
            if name == "placement":
                checks[name] = check_placement(args.device, work, models)
            else:
                check_hand_off(args.device, work, models, checks)
        except Exception as exc:  # one broken check must not hide the others' figures
            checks[f"{name}_error"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    report["misses"] = [name for name, check in report["checks"].items() if not check.get("ok")]
    report["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 1 if report["misses"] else 0


if __name__ == "__main__":
    sys.exit(main())
