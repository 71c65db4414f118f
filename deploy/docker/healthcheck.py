"""The images' HEALTHCHECK: GET ``$HEALTHCHECK_URL`` (a /healthz) and exit 0 on a 2xx answer, else 1.

``--alive`` accepts any HTTP answer, a 503 included: the process is up and serving, whatever it says
about its dependencies. The chart's executor uses it as a liveness probe (a 503 there means "cannot
follow orders now", and a restart would throw away what L1 and L0 hold) and the plain check as its
readiness probe; both run inside the container, so they reach an API bound to 127.0.0.1.

Standard library only and no prewarm import, so a check costs one short interpreter start, and a
broken installation still gets a clear answer. The URL is an environment variable, not a PREWARM_
setting: prewarm refuses PREWARM_ names it does not know, and one image runs several commands (the
scheduler's hint API, ingest's /metrics server), each on its own port.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8080/healthz"


def main(argv: list[str]) -> int:
    alive_only = argv == ["--alive"]
    if argv and not alive_only:
        print("usage: healthcheck.py [--alive]", file=sys.stderr)
        return 2
    url = os.environ.get("HEALTHCHECK_URL", DEFAULT_URL)
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT_S", "4"))) as r:
            ok = 200 <= r.status < 300
    except urllib.error.HTTPError as exc:
        if alive_only:
            return 0  # it answered: alive, if not healthy
        print(f"unhealthy: {url} answered {exc.code}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if not ok:
        print(f"unhealthy: {url} answered {r.status}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
