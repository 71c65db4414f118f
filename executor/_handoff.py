"""The hand-off socket: engine processes on this node take a model's L1 block, or (CUDA) its L0 copy,
from the executor.

The protocol is ``prewarm_client._protocol`` and, for L0 over CUDA IPC, ``prewarm_client._ipc`` (the
client's package owns it; this is the serving side). An ``open`` without a ``mode`` gets the L1 block
(a memfd); with ``mode`` share or copy it gets the L0 shards' CUDA IPC handles and a tensor table
(``_ipc``), on a CUDA executor only: the cpu stand-in refuses with reason ``mode``. A ``rank`` asks
for that rank's shard of a model the node holds across GPUs (``_l0``), from either tier. What this
module adds is who may ask and how long a lease lasts:

* The socket lives in a private directory: created 0700 (or refused when it exists and belongs to
  another user, or is a symlink), the socket 0600. The filesystem already keeps other users out; the
  peer's uid is still checked with ``SO_PEERCRED`` on every connection, so a directory opened up by
  mistake (or a socket passed on) does not open the executor: a peer of another uid gets a refusal
  with a message, and nothing else.
* A lease lasts while its connection is open: an engine that closes it, or dies (the kernel closes its
  sockets: end of file here), gives its leases back. One thread per connection: engines per node are few.
  A copy-mode L0 lease closed with ``"copied": true`` also frees the executor's L0 copy (the engine
  has its own); one that ends any other way leaves it.
* Every refusal (another uid, wrong fingerprint, unknown model, no room, not loaded with ``load:
  false``) is a reply with a message and a reason; nothing is served that the executor did not verify.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from executor import _ipc
from executor._executor import Executor
from executor._leases import DeviceLease, HostLease
from prewarm import (
    CapacityError,
    ConfigError,
    IntegrityError,
    InvalidInput,
    PrewarmError,
    UnknownModel,
    counter,
    gauge,
    get_logger,
    histogram,
)
from prewarm_client import SOCKET_NAME, OpenRequest, ProtocolError, recv_message, send_message

__all__ = ["HandoffServer", "prepare_socket_dir"]

log = get_logger(__name__)

_LEASES = gauge("prewarm_executor_leases", "Leases engines hold on L1 blocks over the hand-off socket.")
_LEASE_WAIT = histogram(
    "prewarm_executor_lease_wait_seconds",
    "Wait of an engine's open until its reply, by the tier the model was in when asked.",
    ["served_from"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 180),
)
_REFUSED = counter(
    "prewarm_executor_handoff_refused_total", "Hand-off requests refused, by reason.", ["reason"]
)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
L = TypeVar("L", HostLease, DeviceLease)


def prepare_socket_dir(path: Path) -> Path:
    """Create ``path`` 0700, or check that an existing one is a real directory of ours; tighten its
    mode to 0700 if it is wider. ``ConfigError`` when it is another user's or a symlink."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"socket directory {path} is not a directory (or is a symlink)", setting="socket_dir"
        )
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"socket directory {path} belongs to uid {info.st_uid}, not this executor's {os.getuid()}",
            setting="socket_dir",
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        log.warning("socket directory was not private: now 0700", extra={"path": str(path)})
        os.chmod(path, 0o700)
    return path


class HandoffServer:
    """Serves ``<socket_dir>/prewarm.sock`` for ``executor`` on background threads; ``start``/``stop``.

    ``changed`` is called after every lease opened or ended (the daemon reports its state then).
    """

    def __init__(
        self, executor: Executor, socket_dir: Path, *, changed: Callable[[], None] = lambda: None
    ) -> None:
        self.executor = executor
        self.socket_dir = Path(socket_dir)
        self.path = self.socket_dir / SOCKET_NAME
        self._changed = changed
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> HandoffServer:
        prepare_socket_dir(self.socket_dir)
        self._remove_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # Bound inside a 0700 directory: nobody else can reach it before the chmod below.
        listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener
        thread = threading.Thread(target=self._accept, name="prewarm-handoff", daemon=True)
        thread.start()
        self._threads.append(thread)
        log.info("hand-off socket ready", extra={"path": str(self.path)})
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> HandoffServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _remove_stale(self) -> None:
        """A socket left by an executor that died is removed; one that still answers is not ours to take."""
        if not os.path.lexists(self.path):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(str(self.path))
        except OSError:
            os.unlink(self.path)
            return
        finally:
            probe.close()
        raise ConfigError(f"another executor is serving {self.path}", setting="socket_dir")

    # ------------------------------------------------------------------ connections

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            conn.setblocking(True)
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="prewarm-handoff-conn", daemon=True
            )
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)
        held: dict[str, HostLease | DeviceLease] = {}
        try:
            pid, uid, _gid = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            if uid != os.getuid():
                # The refusal answers the peer's first request (read, never acted on): closing with
                # it unread would reset the connection before the peer could read why.
                conn.settimeout(5.0)
                with contextlib.suppress(OSError, ProtocolError):
                    for fd in (recv_message(conn) or ({}, []))[1]:
                        os.close(fd)
                self._refuse(
                    conn,
                    f"refused: peer uid {uid} (pid {pid}) is not this executor's uid {os.getuid()}",
                    "peer_uid",
                )
                log.warning("hand-off peer of another uid refused", extra={"uid": uid, "pid": pid})
                return
            while not self._stop.is_set():
                try:
                    received = recv_message(conn)
                except ProtocolError as exc:
                    self._refuse(conn, str(exc), "bad_request")
                    continue
                if received is None:
                    return  # closed, or the engine died: its leases end below
                message, fds = received
                for fd in fds:
                    os.close(fd)  # engines have nothing to hand us
                self._handle(conn, message, held, pid)
        except OSError as exc:
            log.info("hand-off connection lost", extra={"error": str(exc)})
        finally:
            for lease_id in list(held):
                self._end(held.pop(lease_id), "connection closed")
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _handle(
        self, conn: socket.socket, message: dict[str, Any], held: dict[str, HostLease | DeviceLease], pid: int
    ) -> None:
        op = message.get("op")
        if op == "open":
            self._open(conn, message, held, pid)
        elif op == "close":
            lease = held.pop(str(message.get("lease")), None)
            if lease is None:
                self._refuse(conn, f"no lease {message.get('lease')!r} on this connection", "no_lease")
                return
            # A copy-mode engine says it has its copy: the executor's L0 copy can go.
            self._end(lease, "closed", copied=message.get("copied") is True)
            send_message(conn, {"ok": True})
        else:
            self._refuse(conn, f"unknown op {op!r}", "bad_request")

    def _open(
        self, conn: socket.socket, message: dict[str, Any], held: dict[str, HostLease | DeviceLease], pid: int
    ) -> None:
        started = time.perf_counter()
        try:
            request = OpenRequest.from_json(message)
        except ProtocolError as exc:
            self._refuse(conn, str(exc), "bad_request")
            return
        if request.mode is not None:
            self._open_device(conn, request, held, pid, started)
            return
        lease = self._take(
            conn,
            request,
            "L1",
            lambda: self.executor.lease(
                request.model,
                version=request.version,
                sha256=request.sha256,
                load=request.load,
                rank=request.rank,
            ),
        )
        if lease is None:
            return
        host = lease

        def reply() -> tuple[dict[str, Any], int]:
            shard = {"shard": list(host.shard)} if host.shard is not None else {}
            return {"layout": host.files.to_json(), **shard}, host.block.shared.reopen_readonly()

        self._grant(conn, held, lease, pid, started, reply, "lease opened")

    def _open_device(
        self,
        conn: socket.socket,
        request: OpenRequest,
        held: dict[str, HostLease | DeviceLease],
        pid: int,
        started: float,
    ) -> None:
        """L0 over CUDA IPC (``mode`` share or copy): the shards' handles and the tensor table."""
        if not self.executor.l0.is_cuda:
            self._refuse(
                conn,
                f"refused: L0 over CUDA IPC (mode {request.mode}) needs a CUDA executor; this one's L0 "
                f"is on {self.executor.l0.device}: ask without a mode for the L1 block",
                "mode",
            )
            return
        lease = self._take(
            conn,
            request,
            "L0",
            lambda: self.executor.lease_device(
                request.model,
                version=request.version,
                sha256=request.sha256,
                rank=request.rank,
                mode=request.mode or "share",
                load=request.load,
            ),
        )
        if lease is None:
            return
        device = lease

        def reply() -> tuple[dict[str, Any], int]:
            shards, table = _ipc.export(device)
            fd, table_bytes = _ipc.table_memfd(table)
            fields = {
                "mode": device.mode,
                "shards": [s.to_json() for s in shards],
                "table_bytes": table_bytes,
            }
            return fields, fd

        self._grant(conn, held, lease, pid, started, reply, "L0 lease opened", mode=lease.mode)

    def _grant(
        self,
        conn: socket.socket,
        held: dict[str, HostLease | DeviceLease],
        lease: HostLease | DeviceLease,
        pid: int,
        started: float,
        reply: Callable[[], tuple[dict[str, Any], int]],
        opened: str,
        **logged: Any,
    ) -> None:
        """Hold ``lease`` for this connection and send its reply: the fields and the descriptor
        ``reply`` gives, with what every reply carries. A reply that cannot be sent ends the lease."""
        held[lease.id] = lease
        _LEASES.inc()
        spec, served_from = lease.spec, lease.served_from.value
        try:
            fields, fd = reply()
            try:
                wait = time.perf_counter() - started
                common = {"ok": True, "lease": lease.id, "model": spec.id, "version": spec.version}
                common |= {"sha256": spec.sha256, "served_from": served_from, "wait_s": round(wait, 6)}
                send_message(conn, {**common, **fields}, [fd])
            finally:
                os.close(fd)
        except BaseException:
            self._end(held.pop(lease.id), "reply failed")
            raise
        _LEASE_WAIT.labels(served_from).observe(wait)
        extra = {"model": spec.id, "lease": lease.id, "pid": pid, "served_from": served_from, **logged}
        log.info(opened, extra=extra)
        self._changed()

    def _take(
        self, conn: socket.socket, request: OpenRequest, tier: str, take: Callable[[], L | None]
    ) -> L | None:
        """The lease ``take`` gives, or None after refusing with the reason (nothing is served then)."""
        try:
            lease = take()
        except UnknownModel as exc:
            self._refuse(conn, f"refused: unknown model {exc}", "unknown_model")
            return None
        except IntegrityError as exc:
            self._refuse(conn, str(exc), "fingerprint")
            return None
        except CapacityError as exc:
            self._refuse(conn, str(exc), "capacity")
            return None
        except InvalidInput as exc:
            self._refuse(conn, str(exc), exc.reason)
            return None
        except PrewarmError as exc:
            self._refuse(conn, str(exc), "error")
            return None
        if lease is None:
            self._refuse(
                conn, f"{request.model} is not in {tier} and the request said not to load it", "not_loaded"
            )
        return lease

    def _end(self, lease: HostLease | DeviceLease, why: str, *, copied: bool = False) -> None:
        if self.executor.release(lease.id, copied=copied):
            _LEASES.dec()
            log.info("lease ended", extra={"model": lease.spec.id, "lease": lease.id, "why": why})
            self._changed()

    @staticmethod
    def _refuse(conn: socket.socket, message: str, reason: str) -> None:
        _REFUSED.labels(reason).inc()
        with contextlib.suppress(OSError):
            send_message(conn, {"ok": False, "error": message, "reason": reason})
