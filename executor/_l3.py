"""L3: object stores behind one small interface, ``s3://`` through boto3 and ``file://`` for embedded mode.

The executor only ever asks three things of L3: how big an object is, a byte range of it, and (for
``prewarm models register``) its sha256. Ranges are what make the download parallel: the pipeline
issues ``s3_concurrency`` ranged GETs of ``s3_part_bytes`` at a time. Retries with backoff happen per
range, here, on errors classified transient; everything botocore raises is translated at this boundary
into ``ObjectStoreError`` naming the endpoint, so callers (and the CLI) print one line, never a trace.
boto3 is imported only when an ``s3://`` store is opened: a GPU node in embedded mode does not need it.
``MemoryStore`` serves one object from host or device memory, so a demotion to L2 reuses the download
path.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import torch
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from prewarm import ObjectStoreError, S3Settings, get_logger

__all__ = ["FileStore", "ObjectStore", "S3Store", "open_store", "register_store"]

log = get_logger(__name__)
_T = TypeVar("_T")
_HASH_BLOCK = 8 * 2**20
# Ranges are received in pieces of this size and handed on (to the L2 writer) while still in the CPU
# cache; writing whole 32 MiB parts from cold memory ran at half the rate of boto3's download_file.
PIECE = 1 * 2**20
OnPiece = Callable[[int, int], None]


class ObjectStore(ABC):
    """What L3 offers. Implementations are thread-safe: ranges are read from many threads at once."""

    scheme: str

    @abstractmethod
    def size(self, uri: str) -> int:
        """The object's size in bytes."""

    @abstractmethod
    def read_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; exactly ``end - start`` of them or an ``ObjectStoreError``."""

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        """Bytes ``[start, start + len(dest))`` straight into ``dest`` (an L1 buffer): no extra copy.

        ``on_piece(a, b)`` is called as ``dest[a:b]`` lands, in pieces of about ``PIECE`` bytes, so the
        caller can write them on while they are still in the CPU cache. A retried range repeats pieces.
        """
        dest[:] = self.read_range(uri, start, start + len(dest))
        if on_piece is not None:
            for a in range(0, len(dest), PIECE):
                on_piece(a, min(a + PIECE, len(dest)))

    def iter_bytes(self, uri: str, block: int = _HASH_BLOCK) -> Iterator[bytes]:
        size = self.size(uri)
        for start in range(0, size, block):
            yield self.read_range(uri, start, min(start + block, size))

    def sha256(self, uri: str) -> str:
        """Streamed: memory stays at one block whatever the object's size."""
        digest = hashlib.sha256()
        for block in self.iter_bytes(uri):
            digest.update(block)
        return digest.hexdigest()


class FileStore(ObjectStore):
    """``file:///abs/path``: embedded mode and tests; the same ranged reads as S3."""

    scheme = "file"

    @staticmethod
    def path(uri: str) -> Path:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise ObjectStoreError(f"not a file:// uri: {uri}")
        return Path(unquote(parsed.path))

    def size(self, uri: str) -> int:
        try:
            return self.path(uri).stat().st_size
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot stat {uri}: {exc.strerror}") from exc

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        try:
            fd = os.open(self.path(uri), os.O_RDONLY)
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot open {uri}: {exc.strerror}") from exc
        try:
            done = 0
            while done < len(dest):
                n = os.preadv(fd, [dest[done : done + PIECE]], start + done)
                if n <= 0:
                    raise ObjectStoreError(f"file store: {uri} is shorter than {start + len(dest)} bytes")
                if on_piece is not None:
                    on_piece(done, done + n)
                done += n
        finally:
            os.close(fd)

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        try:
            fd = os.open(self.path(uri), os.O_RDONLY)
        except OSError as exc:
            raise ObjectStoreError(f"file store: cannot open {uri}: {exc.strerror}") from exc
        try:
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        if len(data) != end - start:
            raise ObjectStoreError(f"file store: {uri} is shorter than {end} bytes")
        return data


class MemoryStore(ObjectStore):
    """One object already in memory (an L1 block, or an L0 buffer on any device), so a demotion to L2
    reuses the verified L3 → L2 write path (temp file, digests, sha256 check, rename) without touching
    the network. Given the object's own memory as the destination (an L1 block), nothing is copied."""

    scheme = "memory"

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer  # flat uint8, the object's bytes

    def size(self, uri: str) -> int:
        return self._buffer.numel()

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        return bytes(self._buffer[start:end].cpu().numpy())

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        out = torch.frombuffer(dest, dtype=torch.uint8)
        source = self._buffer[start : start + len(dest)]
        if out.data_ptr() != source.data_ptr():
            out.copy_(source)  # device to host when the object is in device memory
        if on_piece is not None:
            for a in range(0, len(dest), PIECE):
                on_piece(a, min(a + PIECE, len(dest)))


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc or not parsed.path.strip("/"):
        raise ObjectStoreError(f"not an s3://bucket/key uri: {uri}")
    return parsed.netloc, unquote(parsed.path.lstrip("/"))


# botocore error codes that a retry can fix (throttling, server trouble); anything else is final.
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}


class S3Store(ObjectStore):
    """``s3://bucket/key`` on AWS or any S3-compatible endpoint (path-style addressing)."""

    scheme = "s3"

    def __init__(self, settings: S3Settings) -> None:
        import boto3
        from botocore.config import Config

        self._settings = settings
        self.endpoint = str(settings.s3_endpoint).rstrip("/") if settings.s3_endpoint else "AWS S3"
        config = Config(
            region_name=settings.s3_region,
            s3={"addressing_style": "path"},
            # S3-compatible servers reject the CRC trailers recent botocore sends by default.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # Retries are ours (per range, with backoff, classified); botocore's would multiply them.
            retries={"max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(settings.s3_concurrency * 2, 10),
            connect_timeout=settings.s3_connect_timeout_s,
            read_timeout=settings.s3_read_timeout_s,
        )
        # Credentials come from boto3's standard chain (env, profile, instance role); never logged.
        session = boto3.session.Session()
        self._client: Any = session.client(
            "s3",
            endpoint_url=str(settings.s3_endpoint) if settings.s3_endpoint else None,
            config=config,
        )

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        retrying = Retrying(
            stop=stop_after_attempt(self._settings.s3_max_attempts),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            retry=retry_if_exception(lambda e: isinstance(e, ObjectStoreError) and e.transient),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                try:
                    return fn()
                except ObjectStoreError:
                    raise
                except Exception as exc:
                    error = self._translate(what, exc)
                    if (
                        error.transient
                        and attempt.retry_state.attempt_number < self._settings.s3_max_attempts
                    ):
                        log.warning("transient S3 error, retrying", extra={"what": what, "error": str(error)})
                    raise error from exc
        raise AssertionError("unreachable")

    def _translate(self, what: str, exc: Exception) -> ObjectStoreError:
        from botocore import exceptions as bx

        where = f"S3 endpoint {self.endpoint}"
        if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
            return ObjectStoreError(
                f"{where}: no S3 credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)"
            )
        if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError):
            return ObjectStoreError(f"{where} is unreachable ({what})", transient=True)
        if isinstance(exc, bx.ReadTimeoutError | bx.ConnectionClosedError | bx.ResponseStreamingError):
            return ObjectStoreError(f"{where}: connection lost during {what}", transient=True)
        if isinstance(exc, bx.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "?"))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}:
                return ObjectStoreError(f"{where}: {what}: not found ({code})")
            if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}:
                return ObjectStoreError(f"{where}: {what}: access denied ({code}); check the credentials")
            transient = code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
            return ObjectStoreError(f"{where}: {what} failed ({code})", transient=transient)
        if isinstance(exc, bx.BotoCoreError | OSError):
            return ObjectStoreError(f"{where}: {what} failed: {exc}", transient=True)
        return ObjectStoreError(f"{where}: {what} failed: {type(exc).__name__}: {exc}")

    def size(self, uri: str) -> int:
        bucket, key = _split_s3(uri)
        head = self._call(f"HEAD {uri}", lambda: self._client.head_object(Bucket=bucket, Key=key))
        return int(head["ContentLength"])

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        bucket, key = _split_s3(uri)

        def get() -> bytes:
            response = self._client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            data: bytes = response["Body"].read()
            if len(data) != end - start:
                # A server that dies mid-body can close the stream cleanly: a short read is transient.
                raise ObjectStoreError(
                    f"S3 endpoint {self.endpoint}: short read of {uri} [{start}, {end}): {len(data)} bytes",
                    transient=True,
                )
            return data

        return self._call(f"GET {uri} bytes {start}-{end - 1}", get)

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        bucket, key = _split_s3(uri)
        end = start + len(dest)

        def get() -> None:
            response = self._client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            body = response["Body"]
            done = 0
            # readinto: the socket's bytes land in the L1 buffer, no intermediate bytes object.
            while done < len(dest):
                n = body.readinto(dest[done : done + PIECE])
                if not n:
                    raise ObjectStoreError(
                        f"S3 endpoint {self.endpoint}: short read of {uri} [{start}, {end}): {done} bytes",
                        transient=True,
                    )
                if on_piece is not None:
                    on_piece(done, done + n)
                done += n

        self._call(f"GET {uri} bytes {start}-{end - 1}", get)

    def put_file(self, path: Path, uri: str) -> None:
        """Upload (tests, the benchmark): boto3's managed multipart transfer."""
        bucket, key = _split_s3(uri)
        self._call(f"PUT {uri}", lambda: self._client.upload_file(str(path), bucket, key))

    def download_file(self, uri: str, path: Path, *, part_bytes: int, concurrency: int) -> None:
        """boto3's own managed download, the baseline the benchmark compares against."""
        from boto3.s3.transfer import TransferConfig

        bucket, key = _split_s3(uri)
        config = TransferConfig(
            multipart_threshold=part_bytes, multipart_chunksize=part_bytes, max_concurrency=concurrency
        )
        self._call(
            f"download {uri}", lambda: self._client.download_file(bucket, key, str(path), Config=config)
        )

    def ensure_bucket(self, bucket: str) -> None:
        def create() -> None:
            from botocore.exceptions import ClientError

            try:
                self._client.head_bucket(Bucket=bucket)
            except ClientError:
                self._client.create_bucket(Bucket=bucket)

        self._call(f"create bucket {bucket}", create)


_FACTORIES: dict[str, Callable[[S3Settings], ObjectStore]] = {
    "file": lambda _settings: FileStore(),
    "s3": S3Store,
}


def register_store(scheme: str, factory: Callable[[S3Settings], ObjectStore]) -> None:
    """Add an object store for another uri scheme (a registry, like vLLM's model loaders)."""
    _FACTORIES[scheme] = factory


def open_store(uri: str, s3: S3Settings) -> ObjectStore:
    """The object store that serves ``uri`` (``s3://bucket/key`` or ``file:///path``)."""
    scheme = uri.partition("://")[0]
    factory = _FACTORIES.get(scheme)
    if factory is None:
        raise ObjectStoreError(
            f"no object store for {scheme!r} uris (known: {', '.join(sorted(_FACTORIES))})"
        )
    return factory(s3)
