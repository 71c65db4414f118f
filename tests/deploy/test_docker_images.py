"""The container images: hadolint-clean, built from files that exist, running real `prewarm` commands.

No container runtime here, so the Dockerfiles are read, not built: every file a stage copies from the
build context must exist (and not be left out by the build's .dockerignore), every command an image
runs must be one the CLI answers `--help` to, and the health-check script must tell a live /healthz
from a failing or absent one.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prewarm_cli import app

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).parent / "hadolint"


@dataclass
class Stage:
    """One FROM ... stage: what it copies from the context, and what the image built from it runs."""

    name: str
    copies: list[tuple[list[str], str]] = field(default_factory=list)  # (context sources, destination)
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    healthcheck: list[str] | None = None
    runs: list[str] = field(default_factory=list)


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def parse_stages(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "FROM":
            words = rest.split()
            stages.append(Stage(words[-1] if "AS" in (w.upper() for w in words) else words[0]))
        elif not stages:
            continue  # ARGs before the first FROM
        elif keyword == "COPY":
            words = rest.split()
            if any(w.startswith("--from=") for w in words):
                continue  # from another stage or image, not from the context
            paths = [w for w in words if not w.startswith("--")]
            stages[-1].copies.append((paths[:-1], paths[-1]))
        elif keyword == "USER":
            stages[-1].user = rest
        elif keyword == "ENTRYPOINT":
            stages[-1].entrypoint = json.loads(rest)
        elif keyword == "CMD":
            stages[-1].cmd = json.loads(rest)
        elif keyword == "HEALTHCHECK":
            stages[-1].healthcheck = json.loads(rest[rest.index("CMD") + 3 :])
        elif keyword == "RUN":
            stages[-1].runs.append(rest)
    return stages


def ignored_by(dockerignore: Path, source: str) -> bool:
    """Whether BuildKit's .dockerignore leaves ``source`` out of the context (last matching rule wins)."""
    ignored = False
    for raw in dockerignore.read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(source, pattern) or source.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_there_is_a_control_plane_and_an_executor_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["control-plane.Dockerfile", "executor.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint_without_a_finding(dockerfile: Path) -> None:
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_file_the_image_copies_exists_and_is_in_the_build_context(dockerfile: Path) -> None:
    dockerignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    sources = [s for stage in parse_stages(dockerfile) for sources, _ in stage.copies for s in sources]
    assert sources, "no COPY from the context found: the parser missed them"
    for source in sources:
        assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"
        assert not ignored_by(dockerignore, source), f"{dockerignore.name} leaves {source} out"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_copies_every_package_its_wheel_is_built_from(dockerfile: Path) -> None:
    # `uv sync --no-editable` builds the project's wheel from the listed packages: one left out of the
    # context breaks the build, not a test, so check it here.
    import tomllib

    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]
    wanted = set(packages["wheel"]["packages"])
    copied = {s for stage in parse_stages(dockerfile) for sources, _ in stage.copies for s in sources}
    assert wanted <= copied


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_a_real_prewarm_command_as_a_non_root_user(dockerfile: Path) -> None:
    final = parse_stages(dockerfile)[-1]
    assert final.entrypoint == ["prewarm"]
    assert final.cmd is not None
    result = CliRunner().invoke(app, [*final.cmd, "--help"])
    assert result.exit_code == 0, result.output
    assert final.user is not None
    assert final.user.split(":")[0] not in ("root", "0")


def test_the_other_control_plane_commands_are_real_prewarm_commands() -> None:
    # The control-plane image's header names the commands the chart runs in it besides its CMD.
    header = (DOCKER / "control-plane.Dockerfile").read_text()
    commands = [
        line.split("prewarm ", 1)[1].split("(")[0].split()
        for line in header.splitlines()
        if line.startswith("#   ") and "prewarm " in line
    ]
    assert [c[0] for c in commands] == ["scheduler", "ingest", "forecast"]
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--help"])
        assert result.exit_code == 0, f"prewarm {' '.join(command)}: {result.output}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_health_check_runs_the_script_the_image_copies(dockerfile: Path) -> None:
    final = parse_stages(dockerfile)[-1]
    assert final.healthcheck is not None
    destinations = {dest: sources for sources, dest in final.copies}
    script = final.healthcheck[-1]
    assert destinations[script] == ["deploy/docker/healthcheck.py"]


def test_images_install_exactly_the_lock_and_the_executor_no_control_plane_libraries() -> None:
    for dockerfile in DOCKERFILES:
        syncs = [run for stage in parse_stages(dockerfile) for run in stage.runs if "uv sync" in run]
        assert syncs, dockerfile.name
        assert all("--frozen" in run and "--no-dev" in run for run in syncs), dockerfile.name
    executor = [r for s in parse_stages(DOCKER / "executor.Dockerfile") for r in s.runs if "uv sync" in r]
    assert not any("--extra" in run or "--all-extras" in run for run in executor)
    control = [r for s in parse_stages(DOCKER / "control-plane.Dockerfile") for r in s.runs if "uv sync" in r]
    assert all("--extra control" in run for run in control)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _check(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py"), *args],
        env={"HEALTHCHECK_URL": url, "HEALTHCHECK_TIMEOUT_S": "2"},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_health_check_passes_on_a_live_healthz(health_server: str) -> None:
    assert _check(f"{health_server}/healthz").returncode == 0


def test_health_check_fails_on_an_unhealthy_answer_and_says_why(health_server: str) -> None:
    result = _check(f"{health_server}/down")
    assert result.returncode == 1
    assert "503" in result.stderr


def test_liveness_check_passes_on_any_answer_and_fails_on_none(health_server: str) -> None:
    assert _check(f"{health_server}/down", "--alive").returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert _check(f"http://127.0.0.1:{s.getsockname()[1]}/healthz", "--alive").returncode == 1


def test_health_check_fails_when_nothing_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: a connection is refused
        assert _check(f"http://127.0.0.1:{port}/healthz").returncode == 1
