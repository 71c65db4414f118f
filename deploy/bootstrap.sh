#!/usr/bin/env bash
# Create or update .venv from uv.lock. Idempotent: when .venv already matches the lock this takes well
# under a second, and uv's cache (~/.cache/uv) means a fresh clone links torch instead of downloading it.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8

uv_bin=""
for candidate in "$(command -v uv 2>/dev/null || true)" "$HOME/.local/bin/uv"; do
  if [[ -n "$candidate" && -x "$candidate" ]] && [[ "$("$candidate" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; then
    uv_bin=$candidate
    break
  fi
done
if [[ -z "$uv_bin" ]]; then
  echo "bootstrap: installing uv $UV_VERSION" >&2
  python3 -m pip install --quiet --disable-pip-version-check --user "uv==$UV_VERSION" 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  uv_bin=$(python3 -c 'import shutil,site,os; p=os.path.join(site.getuserbase(),"bin","uv"); print(p if os.path.exists(p) else shutil.which("uv") or "")')
fi
[[ -x "$uv_bin" ]] || { echo "bootstrap: uv $UV_VERSION could not be installed" >&2; exit 1; }

# --frozen: install exactly what uv.lock says; never re-resolve on a CI machine.
"$uv_bin" sync --frozen --all-extras --quiet

# The simulator's run loop through Cython (sim/_compiled.py), built once per change of its sources into
# ~/.cache/prewarm/sim; without a C compiler the pure Python modules run, the same figures more slowly.
.venv/bin/python sim/_compiled.py || echo "bootstrap: the simulator runs as pure Python" >&2

# System tools the tests drive: promtool (Debian's prometheus package) validates the alert rules, and
# headless Chromium with its driver loads the status page. Installed only when missing and only where
# apt-get can run as root; elsewhere the tests that need them skip and say why (and fail under CI=true).
# PREWARM_SKIP_APT=1 skips this step.
apt_wanted=()
command -v promtool >/dev/null 2>&1 || apt_wanted+=(prometheus)
command -v chromium >/dev/null 2>&1 || apt_wanted+=(chromium)
command -v chromedriver >/dev/null 2>&1 || apt_wanted+=(chromium-driver)
if [[ ${#apt_wanted[@]} -gt 0 && "${PREWARM_SKIP_APT:-0}" != 1 ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${apt_wanted[*]}" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_wanted[@]}"; } >&2 || echo "bootstrap: could not install ${apt_wanted[*]}; their tests skip" >&2
  else
    echo "bootstrap: ${apt_wanted[*]} missing (needs root and apt-get); their tests skip" >&2
  fi
fi
