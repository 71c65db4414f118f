"""A full or failing disk under L2: which failures a load survives by streaming past L2, said once.

L2 is only a cache. A load whose download L2 cannot take (its budget full of models in use or capped
below the model's size, the disk full or over quota, failing, read-only, or the directory gone) still
brings the model to L1 or L0, straight from L3 and verified by its sha256 as ever, and leaves nothing
in L2 (``_hops``, ``_pipeline.fetch_l3``). ``disk_fault`` says which failures those are; ``Bypasses``
counts every such load (``prewarm_executor_l2_bypass_total{reason}``) and logs a reason once, not once
per load, until L2 takes a download again. A download that L2 declined to cache because the copies it
would displace served more requests × bytes (``not_admitted``, ``prewarm.admits``) streams past the
same way; it is counted, not logged, since it is the cache working as meant rather than a fault.

``DiskBudget``: the budget L2 accounts against is never more than its filesystem can hold, i.e. what
is free there now plus what the cache's own files already occupy; the cache asks again before every
download, since other writers (or a shrinking quota) change what is free.
"""

from __future__ import annotations

import errno
import shutil
import threading
from pathlib import Path

from executor import _metrics
from executor._tier import NotAdmitted
from prewarm import CapacityError, IntegrityError, ObjectStoreError, get_logger

__all__ = ["Bypasses", "DiskBudget", "disk_fault"]

log = get_logger(__name__)

_REASONS = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "quota",
    errno.EIO: "io_error",
    errno.EROFS: "read_only",
}
# The directory is gone, refused, or no longer a directory: nothing can be written there either.
_UNUSABLE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM})


def disk_fault(exc: BaseException) -> str | None:
    """The bypass reason of a failure to write L2 (the exception or what caused it), or None when the
    disk is not to blame: bytes that fail their digest, or an L3 error, fail the load as ever."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (IntegrityError, ObjectStoreError)):
            return None
        if isinstance(current, NotAdmitted):
            return "not_admitted"
        if isinstance(current, CapacityError):
            return "full"
        if isinstance(current, OSError) and current.errno is not None:
            if current.errno in _REASONS:
                return _REASONS[current.errno]
            if current.errno in _UNUSABLE:
                return "unusable"
        current = current.__cause__
    return None


class Bypasses:
    """Loads that streamed past L2: each counted, each reason logged once until L2 caches again."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._logged: set[str] = set()

    def streams_past(self, error: BaseException, *, model: str) -> bool:
        """Whether a load survives ``error`` (a failure of L2 to take its download) by streaming past
        L2: when the disk is to blame; then it is counted, and logged if its reason is news."""
        reason = disk_fault(error)
        if reason is None:
            return False
        self.note(reason, model=model, error=error)
        return True

    def note(self, reason: str, *, model: str, error: BaseException) -> None:
        _metrics.L2_BYPASS.labels(reason).inc()
        if reason == "not_admitted":
            log.debug("L2 keeps its busier copies: streaming past", extra={"model": model})
            return
        with self._lock:
            first = reason not in self._logged
            self._logged.add(reason)
        if first:
            log.warning(
                "L2 cannot cache this download: streaming L3 -> L1/L0 without caching (said once per "
                "reason; prewarm_executor_l2_bypass_total counts every load)",
                extra={"reason": reason, "model": model, "dir": str(self._root), "error": str(error)},
            )

    def recovered(self) -> None:
        """L2 took a download again: a later failure is news, and is logged again."""
        with self._lock:
            if not self._logged:
                return
            reasons, self._logged = sorted(self._logged), set()
        log.info("L2 caches downloads again", extra={"dir": str(self._root), "reasons": reasons})


class DiskBudget:
    """The configured L2 budget, capped at what the filesystem under ``root`` can hold."""

    def __init__(self, root: Path, configured: int) -> None:
        self.root = root
        self.configured = configured
        self._capped = False
        _metrics.L2_BUDGET.labels("configured").set(configured)

    def effective(self, held: int) -> int:
        """min(configured, free space + ``held``: the bytes the cache's own files occupy there). Logs
        when the cap starts or stops biting (not on every change of the free space)."""
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as exc:
            free = 0
            log.warning("L2: cannot read free space", extra={"dir": str(self.root), "error": exc.strerror})
        effective = max(0, min(self.configured, free + held))
        capped = effective < self.configured
        if capped != self._capped:
            self._capped = capped
            extra = {
                "dir": str(self.root),
                "configured_bytes": self.configured,
                "effective_bytes": effective,
                "free_bytes": free,
                "cached_bytes": held,
            }
            if capped:
                log.warning("L2 budget capped at what its filesystem can hold", extra=extra)
            else:
                log.info("L2 budget no longer capped by its filesystem", extra=extra)
        _metrics.L2_BUDGET.labels("effective").set(effective)
        return effective

    def unusable(self) -> int:
        """The directory cannot be used at all: nothing is cached there."""
        _metrics.L2_BUDGET.labels("effective").set(0)
        return 0
