"""What a node that only loads weights imports: the GPU check runs on a bare image without the daemon's
web and broker libraries, so naming the daemon is what brings them in."""

from __future__ import annotations

import json
import subprocess
import sys

_DAEMON_ONLY = ["fastapi", "kafka", "uvicorn", "starlette"]


def _loaded_after(statement: str) -> list[str]:
    code = (
        f"import json, sys; {statement}; "
        f"print(json.dumps(sorted(m for m in {_DAEMON_ONLY!r} if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_loading_weights_imports_no_web_or_broker_library() -> None:
    assert _loaded_after("import executor; executor.Executor; executor.run_load_benchmark") == []


def test_naming_the_daemon_brings_its_libraries() -> None:
    loaded = _loaded_after("from executor import ExecutorDaemon, run_forever")
    assert {"fastapi", "kafka"} <= set(loaded)
