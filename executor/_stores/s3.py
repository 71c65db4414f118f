"""``s3://`` objects on AWS or any S3-compatible endpoint, and the botocore boundary.

Retries with backoff happen per range, here, on errors classified transient; everything botocore raises
is translated at this boundary into ``ObjectStoreError`` naming the endpoint, so callers (and the CLI)
print one line, never a trace. boto3 is imported only when an ``S3Store`` is built: importing this
module costs nothing, and a GPU node in embedded mode never needs boto3.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from executor._stores.base import PIECE, ObjectStore, OnPiece
from prewarm import ObjectStoreError, PrewarmError, S3Settings, get_logger

__all__ = ["S3Store"]

log = get_logger(__name__)
_T = TypeVar("_T")


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
                except PrewarmError:
                    # Ours (an L2 write that failed as the bytes landed, in ``on_piece``): not the store's.
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

    def list_prefix(self, uri: str) -> list[tuple[str, int]]:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ObjectStoreError(f"not an s3://bucket/prefix/ uri: {uri}")
        bucket, prefix = parsed.netloc, unquote(parsed.path.lstrip("/"))
        if prefix and not prefix.endswith("/"):
            prefix += "/"  # a prefix names a directory: s3://b/llama must not take s3://b/llama-2/...

        def listing() -> list[tuple[str, int]]:
            found = []
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    rel = str(item["Key"])[len(prefix) :]
                    if rel and not rel.endswith("/"):  # "directory" marker objects hold nothing
                        found.append((rel, int(item["Size"])))
            return sorted(found)

        return self._call(f"LIST {uri}", listing)

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
