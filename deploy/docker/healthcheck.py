"""The images' HEALTHCHECK: GET ``$HEALTHCHECK_URL`` (a /healthz) and exit 0 on a 2xx answer, else 1.

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


def main() -> int:
    url = os.environ.get("HEALTHCHECK_URL", DEFAULT_URL)
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT_S", "4"))) as r:
            ok = 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if not ok:
        print(f"unhealthy: {url} answered {r.status}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
