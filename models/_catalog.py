"""Catalog files: ``models: [{id, version, uri, size_bytes, sha256?, priority?, files?}]`` in YAML.

A checkpoint entry (a Hugging Face directory or object-store prefix) lists its files::

    - id: llama-tiny
      version: "1"
      uri: s3://models/llama-tiny/
      size_bytes: 1234567          # the safetensors files together
      files:
        - {path: config.json, size_bytes: 612, sha256: ...}
        - {path: model-00001-of-00002.safetensors, size_bytes: 617283, sha256: ...}

A size may be written as people write it (``16GB``, ``2GiB``), as in cluster files.

``Catalog.load`` collects every problem before failing, one line per problem naming the entry and the
field, so an operator fixes a bad catalog in one pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from models._files import EntryProblems
from models._spec import ModelSpec
from prewarm import ConfigError, UnknownModel, get_logger

__all__ = ["CATALOG_VERSION", "Catalog", "CatalogProblem", "CatalogWatcher", "parse_entry", "problem_lines"]

log = get_logger(__name__)

CATALOG_VERSION = 1


class CatalogProblem(ConfigError):
    """A catalog failed validation; ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(problems), setting="catalog")
        self.problems = problems


def problem_lines(label: str, exc: ValidationError) -> list[str]:
    """One line per problem: ``models[3] (llama).files[2].path: ...``."""
    lines = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, EntryProblems):
            # Rules across fields (a checkpoint's files): each problem names its own field.
            lines += [f"{label}.{problem}" for problem in cause.problems]
            continue
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]) or ".entry"
        lines.append(f"{label}{field}: {err['msg']}")
    return lines


def parse_entry(data: dict[str, Any], source: str = "entry") -> ModelSpec:
    """One catalog entry, validated; ``CatalogProblem`` names each problem as ``Catalog.load`` would."""
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        name = data.get("id")
        raise CatalogProblem(source, problem_lines(str(name) if name else "entry", exc)) from exc


class Catalog:
    """An immutable, validated set of model specs, looked up by id."""

    def __init__(self, specs: Iterable[ModelSpec]) -> None:
        self._specs: dict[str, ModelSpec] = {}
        for spec in specs:
            if spec.id in self._specs:
                raise CatalogProblem("catalog", [f"models[{spec.id}].id: duplicate id {spec.id!r}"])
            self._specs[spec.id] = spec

    # -- reading

    @classmethod
    def from_data(cls, data: Any, source: str = "catalog") -> Catalog:
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            raise CatalogProblem(source, ["catalog: must be a mapping with a 'models' list"])
        version = data.get("version", CATALOG_VERSION)
        if version != CATALOG_VERSION:
            raise CatalogProblem(source, [f"catalog.version: {version!r} is not supported (expected 1)"])
        problems: list[str] = []
        specs: list[ModelSpec] = []
        seen: dict[str, int] = {}
        for index, entry in enumerate(data["models"]):
            name = entry.get("id") if isinstance(entry, dict) else None
            label = f"models[{index}]" + (f" ({name})" if isinstance(name, str) else "")
            if not isinstance(entry, dict):
                problems.append(f"{label}: entry must be a mapping")
                continue
            try:
                spec = ModelSpec.model_validate(entry)
            except ValidationError as exc:
                problems += problem_lines(label, exc)
                continue
            if spec.id in seen:
                problems.append(f"{label}.id: duplicate id {spec.id!r} (first at models[{seen[spec.id]}])")
                continue
            seen[spec.id] = index
            specs.append(spec)
        if problems:
            raise CatalogProblem(source, problems)
        return cls(specs)

    @classmethod
    def load(cls, path: Path) -> Catalog:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read catalog {path}: {exc.strerror}", setting="catalog") from exc
        except yaml.YAMLError as exc:
            raise CatalogProblem(str(path), [f"catalog: not valid YAML: {exc}"]) from exc
        return cls.from_data(data, source=str(path))

    # -- writing

    def to_data(self) -> dict[str, Any]:
        return {
            "version": CATALOG_VERSION,
            "models": [_entry_data(s) for s in self._specs.values()],
        }

    def save(self, path: Path) -> None:
        """Write atomically (temp file, then rename) so a reader never sees half a catalog."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(yaml.safe_dump(self.to_data(), sort_keys=False))
        tmp.replace(path)

    def with_spec(self, spec: ModelSpec) -> Catalog:
        """A new catalog with ``spec`` added, or replacing the entry with the same id."""
        specs = dict(self._specs)
        specs[spec.id] = spec
        return Catalog(specs.values())

    # -- lookup

    def __getitem__(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            raise UnknownModel(model_id) from None

    def get(self, model_id: str) -> ModelSpec | None:
        return self._specs.get(model_id)

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def ids(self) -> list[str]:
        return list(self._specs)


def _entry_data(spec: ModelSpec) -> dict[str, Any]:
    # A single-file entry is written as before: no empty ``files`` list.
    return spec.model_dump(mode="json", exclude_none=True, exclude={"files"} if not spec.files else None)


class CatalogWatcher:
    """Re-reads a catalog file when it changes, so long-running services pick up new versions.

    ``poll`` returns the new catalog once per change, or None. A file that fails validation is logged
    and skipped: the service keeps the catalog it has rather than stopping (degrade, don't die).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mtime = self._stat()

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    def poll(self) -> Catalog | None:
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return None
        try:
            catalog = Catalog.load(self.path)
        except ConfigError as exc:
            log.warning(
                "catalog reload failed; keeping the current one",
                extra={"path": str(self.path), "error": str(exc)},
            )
            return None
        finally:
            self._mtime = mtime
        log.info("catalog reloaded", extra={"path": str(self.path), "models": len(catalog)})
        return catalog
