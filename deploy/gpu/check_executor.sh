#!/usr/bin/env bash
# The executor's GPU check, in one prepared run of about 8 minutes on one CUDA machine:
#
#   1. loader   L2 -> L1 -> L0 on the device, tensors equal, load rates against targets
#               (python -m executor._gpucheck)                       -> $OUT/executor-gpucheck.json
#   2. hand-off per-GPU L0 placement on the machine's GPUs, a model held as two shards, an engine
#               process taking weights from the pinned shared L1, L0 over CUDA IPC in a second process
#               (share and copy, rank shards, memory given back to the device)
#               (python -m executor._gpucheck_ipc)                   -> $OUT/ipc-check.json
#   3. bench    prewarm bench handoff --device cuda: engine from disk, from L1, from L0 over IPC
#                                                                    -> $OUT/handoff.json
# Each step's output goes to $OUT/<step>.log as well; every step runs even when an earlier one
# failed, and the script exits non-zero when any did (a miss still leaves its figures).
#
# Environment. The GPU image brings Python 3.12 with torch, safetensors, numpy, transformers, typer,
# pyyaml, xxhash, filelock and prometheus-client; this checkout's .venv is not used there (another
# Python, and torch wheels are gigabytes). The few pure packages prewarm's spine needs besides
# (pydantic and its kin, tenacity) travel as wheels fetched here once and installed into a private
# folder ($SITE), never into the image's environment:
#
#   bash deploy/gpu/check_executor.sh --fetch-wheels     # here, with a package index reachable
#   device run, from the repository root, carry ["deploy/gpu/wheels"], timeout_s 560:
#     bash deploy/gpu/check_executor.sh
#
# Sizes and limits: LOAD_SIZE (default 2GiB), IPC_SIZE (256MiB), HANDOFF_SIZE (1GiB); OUT (default
# /tmp/prewarm-gpucheck). The per-step timeouts below add up to 500 s. DEVICE=cpu runs the same steps
# on the cpu stand-in (the IPC checks then record the cpu executor's refusal): a rehearsal of the
# script itself on a machine without a GPU, e.g. PATH=$PWD/.venv/bin:$PATH DEVICE=cpu LOAD_SIZE=64MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-deploy/gpu/wheels}  # not committed; name it in the device run's `carry`
SITE=.gpucheck-site                  # where missing packages go; never the image's environment
# import name=distribution, for every pure package prewarm's spine, the executor and the CLI import
NEEDED=(pydantic=pydantic pydantic_settings=pydantic-settings tenacity=tenacity xxhash=xxhash
  filelock=filelock yaml=pyyaml prometheus_client=prometheus-client typer=typer)

if [[ ${1:-} == --fetch-wheels ]]; then
  # Wheels for the image's Python (3.12, x86-64); binary only, so nothing is built there.
  python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" "${NEEDED[@]#*=}"
  ls "$WHEELS"
  exit 0
fi

LOAD_SIZE=${LOAD_SIZE:-${1:-2GiB}}
IPC_SIZE=${IPC_SIZE:-256MiB}
HANDOFF_SIZE=${HANDOFF_SIZE:-1GiB}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/prewarm-gpucheck}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, safetensors, numpy' || { echo "torch, safetensors and numpy are required" >&2; exit 2; }
# On the path before the probe, so a second run finds what the first installed and installs nothing.
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
missing=$(python3 - "${NEEDED[@]}" <<'PY'
import importlib.util, sys
print(" ".join(dist for mod, _, dist in (a.partition("=") for a in sys.argv[1:]) if importlib.util.find_spec(mod) is None))
PY
)
if [[ -n $missing ]]; then
  [[ -d $WHEELS ]] || { echo "missing $missing and no $WHEELS: run --fetch-wheels first" >&2; exit 2; }
  # shellcheck disable=SC2086  # one word per distribution
  python3 -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" $missing
fi
# prewarm's settings refuse unknown PREWARM_* variables; the check needs none.
for v in $(env | grep -o '^PREWARM_[A-Z_0-9]*' || true); do unset "$v"; done
{
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

failed=()
step() {  # step NAME SECONDS COMMAND...: run it with a limit, its output shown and kept in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*"
  local started=$SECONDS status=0
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || status=$?
  tail -n 40 "$OUT/$name.log"
  echo "=== $name: exit $status after $((SECONDS - started))s"
  if [[ $status -ne 0 ]]; then failed+=("$name"); fi
}

CLI='import prewarm_cli._handoff_bench; from prewarm_cli import main; main()'
step loader 230 python3 -m executor._gpucheck --device "$DEVICE" --size "$LOAD_SIZE" \
  --json "$OUT/executor-gpucheck.json"
step handoff-ipc 120 python3 -m executor._gpucheck_ipc --device "$DEVICE" --size "$IPC_SIZE" \
  --json "$OUT/ipc-check.json"
step bench-handoff 150 python3 -c "$CLI" bench handoff --device "$DEVICE" --size "$HANDOFF_SIZE" \
  --dir /tmp/prewarm-bench-handoff --json "$OUT/handoff.json"

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED: ${failed[*]} (figures and logs in $OUT)" >&2
  exit 1
fi
echo "all steps passed; figures in $OUT"
