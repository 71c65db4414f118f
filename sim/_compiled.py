"""The simulator's run loop compiled with Cython, used only when it was built from these very sources.

The modules named in ``COMPILED`` are plain Python, and stay the reference: Cython compiles them
unchanged (no annotations, no second copy of any rule), which runs the baselines on the benchmark's
2-node cluster 1.4-1.5 × faster with every figure the same (no faster at 10,000 models on 100 nodes:
docs/benchmarks.md). ``build`` writes the extension modules into a directory named after
a hash of the sources and the interpreter (``compile_dir``); ``install`` loads them from there when that
directory exists, so an edited source, another Python or a missing compiler means the pure modules run,
never a stale build. ``PREWARM_SIM_PURE=1`` runs the pure modules even when a build is there.

    prewarm sim compile       # or `python sim/_compiled.py`, as `make env` runs it
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# The world, its parts and the policies: what the event loop runs on every request, load and hop. The
# rest (the bench, the suite, the sweep, the scenarios) runs once a run and stays as it is.
COMPILED = (
    "_hints",
    "_links",
    "_metrics",
    "_node",
    "_route",
    "_policies",
    "_world",
    "_unlimited",
    "_histogram",
    "_oracle",
    "_prewarm",
    "_run",
)
PURE_ENV = "PREWARM_SIM_PURE"
BUILD_ENV = "PREWARM_SIM_BUILD"
_HERE = Path(__file__).resolve().parent


def sources(package_dir: Path = _HERE) -> dict[str, bytes]:
    """The source of each compiled module, by module name."""
    return {name: (package_dir / f"{name}.py").read_bytes() for name in COMPILED}


def build_key(code: Mapping[str, bytes]) -> str:
    """What a build is valid for: these sources on this interpreter (its ABI tag names the extension
    modules it can load)."""
    digest = hashlib.sha256(importlib.machinery.EXTENSION_SUFFIXES[0].encode())
    for name in sorted(code):
        digest.update(b"\0" + name.encode() + b"\0" + code[name])
    return digest.hexdigest()[:20]


def build_root() -> Path:
    """Where builds live: ``$PREWARM_SIM_BUILD``, else the user's cache (shared by every clone: a build
    is found only by its sources' hash)."""
    if os.environ.get(BUILD_ENV):
        return Path(os.environ[BUILD_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "prewarm" / "sim"


def compile_dir(root: Path | None = None, package_dir: Path = _HERE) -> Path:
    return (root or build_root()) / build_key(sources(package_dir))


def is_compiled(directory: Path) -> bool:
    """Whether ``directory`` holds a whole build."""
    return _built(directory) is not None


def _built(directory: Path) -> dict[str, Path] | None:
    """The extension module of each compiled module in ``directory``, or None unless every one is."""
    found: dict[str, Path] = {}
    for name in COMPILED:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = directory / f"{name}{suffix}"
            if path.is_file():
                found[f"sim.{name}"] = path
                break
        else:
            return None
    return found


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``sim``'s compiled modules in their build directory, ahead of the sources."""

    def __init__(self, paths: Mapping[str, Path]) -> None:
        self.paths = dict(paths)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        where = self.paths.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


def install(root: Path | None = None) -> bool:
    """Load the compiled modules from now on, when a build of the present sources exists (and
    ``PREWARM_SIM_PURE`` is not set). Called by ``sim/__init__`` before any module it names is imported.
    Returns whether the compiled modules are the ones that will load."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    try:
        paths = _built(compile_dir(root))
    except OSError:  # no cache directory to read, or a source missing from an odd install
        return False
    if paths is None:
        return False
    sys.meta_path.insert(0, _Finder(paths))
    return True


def running_compiled() -> bool:
    """Whether the simulator's modules running now are the compiled ones."""
    world = sys.modules.get("sim._world")
    return isinstance(getattr(world, "__loader__", None), importlib.machinery.ExtensionFileLoader)


class CompileError(RuntimeError):
    """The compiled modules could not be built (no Cython, no C compiler, a compile error): the pure
    modules run. The message ends with what the compiler said."""


def build(root: Path | None = None, *, jobs: int | None = None) -> Path:
    """Compile the modules of ``COMPILED`` (Cython, then the C compiler) into their build directory,
    unless it is there already. Needs Cython, setuptools and a C compiler (``CompileError`` without)."""
    target = compile_dir(root)
    if is_compiled(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as tmp:
        package = Path(tmp, "sim")
        package.mkdir()
        (package / "__init__.py").touch()  # so the modules are named sim._world and so on
        for name in COMPILED:
            shutil.copyfile(_HERE / f"{name}.py", package / f"{name}.py")
        command = [sys.executable, "-m", "Cython.Build.Cythonize", "-3", "-i", "-q"]
        command += ["-j", str(jobs or os.cpu_count() or 1)]
        command += [f"sim/{name}.py" for name in COMPILED]
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, check=False)
        made = _built(package)
        if done.returncode or made is None:
            said = (done.stderr or done.stdout).strip()[-3000:]
            raise CompileError(f"the Cython build of the simulator failed (exit {done.returncode}):\n{said}")
        staged = Path(tmp, "built")
        staged.mkdir()
        for path in made.values():
            shutil.move(path, staged / path.name)
        try:
            staged.rename(target)
        except OSError:  # another build of the same sources got there first: it is as good
            if not is_compiled(target):
                raise
    return target


def compile_run_loop(say: Callable[[str], None]) -> Path:
    """``build``, saying so when it has to compile."""
    target = compile_dir()
    if not is_compiled(target):
        say(f"sim: compiling the run loop into {target} (once per change of its sources)")
        build()
    return target


if __name__ == "__main__":
    # `python sim/_compiled.py`, as `make env` runs it: a script, not `-m`, so the simulator is not
    # imported to find it built (tens of milliseconds then).
    try:
        compile_run_loop(lambda line: print(line, file=sys.stderr))
    except (CompileError, OSError) as exc:
        sys.exit(f"{exc}\nsim: the pure Python modules run")
