#!/usr/bin/env bash
# The executor's GPU check: L2 -> L1 -> L0 on a real CUDA device, correctness and rates against targets.
#
#   bash deploy/gpu/check_executor.sh --fetch-wheels   # here, once: the pure packages a bare image lacks
#   bash deploy/gpu/check_executor.sh [SIZE]           # on the GPU machine, from the repo root (< 5 min)
#
# The GPU image has torch, safetensors and numpy (and xxhash, filelock, pyyaml, prometheus-client, typer);
# what else prewarm's spine imports is installed from deploy/gpu/wheels into a private folder, never into
# the image's environment. Writes $OUT/executor-gpucheck.json (OUT defaults to /tmp) and exits non-zero
# if a tensor differs or a ratio misses its target.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-deploy/gpu/wheels}  # not committed; name it in the device run's `carry`
SITE=.gpucheck-site                  # where missing packages go; never the image's environment
# import name=distribution, for every pure package prewarm's spine and the executor import
NEEDED=(pydantic=pydantic pydantic_settings=pydantic-settings tenacity=tenacity xxhash=xxhash
  filelock=filelock yaml=pyyaml prometheus_client=prometheus-client)

if [[ ${1:-} == --fetch-wheels ]]; then
  # Wheels for the image's Python (3.12, x86-64); binary only, so nothing is built there.
  python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" "${NEEDED[@]#*=}"
  ls "$WHEELS"
  exit 0
fi

SIZE=${1:-4GiB}
OUT=${OUT:-/tmp}
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
  # shellcheck disable=SC2086
  python3 -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" $missing
fi
# prewarm's settings refuse unknown PREWARM_* variables; the check needs none.
for v in $(env | grep -o '^PREWARM_[A-Z_0-9]*' || true); do unset "$v"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 290 python3 -m executor._gpucheck --size "$SIZE" --json "$OUT/executor-gpucheck.json"
