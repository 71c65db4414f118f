"""Host memory for the buffers that disk reads land in: page-aligned, in transparent huge pages.

Where a buffer's pages come from decides how fast O_DIRECT reads into it run. Every read is a DMA into
the buffer's physical pages; 4 KiB pages faulted in by several threads at once (``torch.empty`` then a
parallel ``fill_``) are scattered in physical memory, so each 32 MiB read becomes thousands of
scatter-gather segments that the block layer splits into many requests. Measured on the development VM
(1 GiB file, 4 threads × 32 MiB O_DIRECT reads): 1.4-1.7 GB/s into a ``torch.empty`` buffer touched by
``fill_``, 2.4-2.6 GB/s into an anonymous mapping touched by one thread, 2.7 GB/s into one advised for
huge pages. Huge pages also cut the pages ``cudaHostRegister`` has to walk and lock by 512 ×.

So the CPU device's L0 buffers and scratch buffers come from ``host_buffer``: a private anonymous
mapping (page-aligned by construction), advised ``MADV_HUGEPAGE`` (honoured when transparent huge pages
are ``always`` or ``madvise``; harmless otherwise), wrapped as a uint8 tensor that keeps the mapping alive.

L1 blocks come from ``shared_buffer``: the same kind of memory, but a memfd that the hand-off socket can
pass to an engine process (``SCM_RIGHTS``), which maps it read-only. A memfd rather than a file under
``/dev/shm``: in a container ``/dev/shm`` is per pod and 64 MB by default, a memfd is bounded only by
the memory cgroup, and it has no name another process could open or leave behind. In hugetlbfs pages
(``MFD_HUGETLB``) where the kernel has them reserved (``vm.nr_hugepages``), else shmem pages with
``MADV_HUGEPAGE`` (huge when ``shmem_enabled`` allows). One memfd per block, so a block's memory lives
exactly as long as someone maps it: an engine still holding views after its lease keeps its own bytes,
never bytes the executor has since reused for another model.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import tempfile
import threading
from dataclasses import dataclass

import torch

from executor._tier import ALIGN

__all__ = ["SharedBuffer", "host_buffer", "populate", "shared_buffer"]

_MADV_POPULATE_WRITE = 23  # Linux 5.14+; not in Python's mmap module before 3.13
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def host_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of page-aligned host memory as a uint8 tensor, in huge pages where the kernel allows.

    Pages are faulted in on first touch, unless ``populate`` is called.
    """
    mapping = mmap.mmap(-1, max(nbytes, ALIGN), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no THP support: plain pages, still aligned
        mapping.madvise(mmap.MADV_HUGEPAGE)
    # frombuffer holds a reference to the mapping: it is unmapped when the last view goes.
    return torch.frombuffer(mapping, dtype=torch.uint8)[:nbytes]


def populate(buffer: torch.Tensor) -> None:
    """Fault in every page of a ``host_buffer`` now, sequentially and without changing its contents."""
    start = buffer.data_ptr() - buffer.data_ptr() % ALIGN
    length = buffer.data_ptr() + buffer.numel() - start
    if length <= 0:
        return
    if _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_POPULATE_WRITE) != 0:
        # Older kernel: a write to one byte of every page, on this thread (the value is unchanged).
        pages = buffer.numpy()[::ALIGN]
        pages += 0


_HUGE_PAGE = 2 * 2**20
_hugetlb = {"usable": True}  # cleared after the first refusal: no point asking on every block
_hugetlb_lock = threading.Lock()


@dataclass
class SharedBuffer:
    """Host memory another local process can map: ``fd`` (a memfd, or an unlinked file under /dev/shm)
    and ``tensor``, this process's writable shared mapping of all ``size`` bytes (``nbytes`` asked)."""

    fd: int
    nbytes: int
    size: int  # the memfd's size: ``nbytes`` rounded up to its page size
    kind: str  # "memfd-hugetlb", "memfd" or "dev-shm"
    tensor: torch.Tensor

    def reopen_readonly(self) -> int:
        """A new read-only descriptor of the same memory, for a client (it cannot map it writable).

        Opening ``/proc/self/fd/N`` makes a new open file description, unlike ``dup``, which would
        share this one's read-write access mode.
        """
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Close the descriptor; the memory goes when the last mapping (ours, or a client's) does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def shared_buffer(nbytes: int, *, name: str = "prewarm-l1") -> SharedBuffer:
    """``nbytes`` of shared host memory (see the module docstring), page-aligned, not yet faulted in.

    Raises ``OSError`` (``ENOMEM``) when the kernel has no room for it.
    """
    if _hugetlb["usable"] and hasattr(os, "memfd_create"):
        size = -(-max(nbytes, 1) // _HUGE_PAGE) * _HUGE_PAGE
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_HUGETLB)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                os.ftruncate(fd, size)
                # A shared hugetlb mapping reserves its pages here: no reserved huge pages, ENOMEM now
                # rather than SIGBUS on first touch.
                return _wrap(fd, nbytes, size, "memfd-hugetlb", advise=False)
            except OSError:
                os.close(fd)
                with _hugetlb_lock:
                    _hugetlb["usable"] = False
    size = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        kind = "memfd"
    except (AttributeError, OSError):
        # No memfd (an old kernel or a seccomp profile without it): a file under /dev/shm, unlinked at
        # once so that nothing is left behind and only the passed descriptor reaches it.
        fd, path = tempfile.mkstemp(prefix=f"{name}-", dir="/dev/shm")
        os.unlink(path)
        kind = "dev-shm"
    try:
        os.ftruncate(fd, size)
        return _wrap(fd, nbytes, size, kind, advise=True)
    except BaseException:
        os.close(fd)
        raise


def _wrap(fd: int, nbytes: int, size: int, kind: str, *, advise: bool) -> SharedBuffer:
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if advise:
        with contextlib.suppress(AttributeError, OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE)
    # frombuffer holds a reference to the mapping: it is unmapped when the last view goes.
    return SharedBuffer(fd, nbytes, size, kind, torch.frombuffer(mapping, dtype=torch.uint8))
