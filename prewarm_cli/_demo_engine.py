"""``prewarm demo``'s engine step: an inference engine process starts warm from prewarm.

``run_engine_demo(workdir)`` does what a node does for a real engine, with real processes:

1. writes a tiny sharded Llama checkpoint (``models.synth_checkpoint``: index, two shards, config) as
   the model's L3 (a ``file://`` directory) and a catalog naming it;
2. starts ``prewarm executor run --standalone --socket-dir`` as its own process (load API on a free
   localhost port, the hand-off socket in a private directory, no Kafka);
3. brings the model to L1 through the load API (``POST /v1/load {"tier": "L1"}``), as an order would;
4. starts a separate engine process that imports only ``prewarm_client`` and transformers, builds the
   model from the block's ``config.json`` on the meta device, takes every weight from the executor's
   shared L1 block (``prewarm_client.transformers.load_model``), and greedily generates a few tokens;
   then, in the same process, loads the same model from the checkpoint files and generates again.

It returns what the coordinator prints: how long each part took, how many bytes the engine read from
disk while it took the weights (its ``/proc/self/io`` ``read_bytes`` over a second load from L1, the
first having paged in the code the load runs: 0, against what it read from the files with their pages
dropped from the cache), and whether the tokens equal those of the
model loaded from the files. The executor is stopped before returning.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["run_engine_demo"]

MODEL = "llama-tiny"
PROMPT = [1, 17, 42, 99, 7]
_EXECUTOR = "import prewarm_cli._executor_run; from prewarm_cli import main; main()"

ENGINE = """
    import json, sys, time
    started = time.perf_counter()
    import torch
    import transformers
    from transformers.models.llama import modeling_llama  # code, imported before anything is measured
    from prewarm_client.transformers import load_model, parameters_on_meta

    def read_bytes():
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))

    model_id, socket_dir, checkpoint, prompt = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    # transformers imports modules lazily the first time a model is built: build a small one first, so
    # that what is read below is weights, not code.
    config = transformers.AutoConfig.for_model("llama", hidden_size=8, intermediate_size=8,
                                               num_hidden_layers=1, num_attention_heads=1, vocab_size=8)
    with parameters_on_meta():
        transformers.AutoModelForCausalLM.from_config(config).load_state_dict({}, strict=False, assign=True)
    # A first load from L1 pages in the code it runs that the small model did not (where a busy machine
    # had dropped a library's pages from its cache, 100-200 kB were read here): the load measured is
    # the second, so that what it reads from disk is weights, not code. Each maps the L1 block anew.
    load_model(model_id, socket_dir=socket_dir)
    imported = time.perf_counter() - started
    before, start = read_bytes(), time.perf_counter()
    model = load_model(model_id, socket_dir=socket_dir)  # config.json and weights from the L1 block
    load_s, read = time.perf_counter() - start, read_bytes() - before
    start = time.perf_counter()
    with torch.no_grad():
        tokens = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist()
    generate_s = time.perf_counter() - start

    before, start = read_bytes(), time.perf_counter()
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    files_s, files_read = time.perf_counter() - start, read_bytes() - before
    with torch.no_grad():
        reference_tokens = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    print(json.dumps({
        "engine_import_s": imported,
        "engine_load_from_l1_s": load_s,
        "engine_read_bytes_from_l1": read,
        "engine_generate_s": generate_s,
        "engine_load_from_files_s": files_s,
        "engine_read_bytes_from_files": files_read,
        "tokens": tokens,
        "identical_to_files": tokens == reference_tokens[0].tolist(),
        "ours_imported": sorted(m for m in ("prewarm", "executor", "models") if m in sys.modules),
    }))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    """The parent's environment without its prewarm settings, with this checkout importable."""
    import prewarm_client

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    root = str(Path(prewarm_client.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def _drop_pages(paths: Iterable[Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def _wait_up(proc: subprocess.Popen[str], base: str, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the executor exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            _http("GET", base + "/healthz", timeout=2)
            return
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.2)
    raise RuntimeError(f"the executor's API did not come up within {timeout_s:.0f} s")


def run_engine_demo(workdir: Path) -> dict[str, Any]:
    """Run the steps of the module docstring under ``workdir``; the figures, or ``ok: false`` and why."""
    from models import Catalog, synth_checkpoint

    if importlib.util.find_spec("transformers") is None:
        return {"ok": False, "reason": "transformers is not installed (the dev group has it)"}
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "l3" / MODEL
    spec = synth_checkpoint(checkpoint, model_id=MODEL, shards=2, seed=3)
    catalog_path = workdir / "catalog.yaml"
    Catalog([spec]).save(catalog_path)
    port, sockets, log = _free_port(), workdir / "sockets", workdir / "executor.log"
    base = f"http://127.0.0.1:{port}"
    overrides = {
        "executor_api_host": "127.0.0.1",
        "executor_api_port": str(port),
        "device": "cpu",
        "l1_budget_bytes": str(max(64 * 2**20, 2 * spec.size_bytes)),
        "l0_budget": str(float(max(64 * 2**20, 2 * spec.size_bytes))),
        "l0_reserve_bytes": "0",
    }
    command = [sys.executable, "-c", _EXECUTOR]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    command += ["executor", "run", "--standalone", "--node", "demo", "--catalog", str(catalog_path)]
    command += ["--cache-dir", str(workdir / "cache"), "--socket-dir", str(sockets)]
    started = time.perf_counter()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command, env=_env(), stdout=log_file, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_up(proc, base, log)
        executor_start_s = time.perf_counter() - started
        loaded = _http("POST", base + "/v1/load", {"model": MODEL, "tier": "L1"})
        _drop_pages(checkpoint.glob("*.safetensors"))  # the engine's own load from files starts cold
        args = [MODEL, str(sockets), str(checkpoint), json.dumps(PROMPT)]
        engine = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(ENGINE), *args],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if engine.returncode != 0:
            raise RuntimeError(f"the engine process failed: {engine.stderr[-2000:]}")
        figures: dict[str, Any] = json.loads(engine.stdout.strip().splitlines()[-1])
        state = _http("GET", base + "/v1/state")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    l1 = next(t for t in state["tiers"] if t["tier"] == "L1")
    return {
        "ok": figures["engine_read_bytes_from_l1"] == 0 and figures["identical_to_files"],
        "model": MODEL,
        "weights_bytes": spec.size_bytes,
        "files": [f.path for f in spec.files],
        "executor_start_s": executor_start_s,
        "executor_l1_load": loaded,
        "l1_resident": [r["model"] for r in l1["resident"]],
        **figures,
    }
