"""Model archives under an S3 prefix (SageMaker multi-model endpoints' ModelDataUrl).

boto3 is imported when a store is created, so modelhost runs without it unless s3:// is used
(`pip install modelhost[sagemaker]`). Credentials and region come from boto3's usual chain
(environment, config files, instance or task role).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from modelhost.errors import ModelhostError, not_found, unavailable
from modelhost.store.archive_store import ARCHIVE_SUFFIX, check_target, write_atomically

# S3 error codes that mean "no such object" (HeadObject answers a bare 404).
_MISSING = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}


class S3ArchiveStore:
    """Archives at s3://bucket/prefix/<target>; one boto3 client per store (boto3 clients are thread-safe).

    The prefix is a "directory": "models" and "models/" both mean keys under "models/".
    """

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError
            from s3transfer.exceptions import RetriesExceededError
        except ImportError:
            raise unavailable("model archives on s3:// need boto3: pip install 'modelhost[sagemaker]'") from None
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.description = f"s3://{bucket}/{self.prefix}"
        # Standard retries: 3 attempts unless AWS_MAX_ATTEMPTS says otherwise.
        config = Config(retries={"mode": "standard"}, connect_timeout=10, read_timeout=60)
        self._client: Any = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self._client_error = ClientError
        # What a request can raise besides an S3 error answer: no credentials, no connection, retries spent.
        self._failures = (BotoCoreError, RetriesExceededError, OSError)

    def local_path(self, target: str) -> None:
        return None

    def download(self, target: str, into: Path) -> Path:
        key = self._key(check_target(target))
        filename = PurePosixPath(key).name

        def fetch(path: Path) -> None:
            # download_file fetches large objects in parallel ranged parts.
            self._client.download_file(self.bucket, key, str(path))

        try:
            return write_atomically(into, filename, fetch)
        except self._client_error as exc:
            raise self._answer_error(exc, f"model archive '{target}' not found in {self.description}") from None
        except self._failures as exc:
            raise unavailable(f"cannot download model archive '{target}' from {self.description}: {exc}") from None

    def stamp(self, target: str) -> str:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(check_target(target)))
        except self._client_error as exc:
            raise self._answer_error(exc, f"model archive '{target}' not found in {self.description}") from None
        except self._failures as exc:
            raise unavailable(f"cannot read model archive '{target}' in {self.description}: {exc}") from None
        return _stamp(head.get("ETag", ""), head.get("ContentLength", ""))

    def list(self) -> list[str]:
        return sorted(self.stamps())

    def stamps(self) -> dict[str, str]:
        start = f"{self.prefix}/" if self.prefix else ""
        found = {}
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                for entry in page.get("Contents", []):
                    key: str = entry["Key"]
                    if key.endswith(ARCHIVE_SUFFIX):
                        found[key[len(start):]] = _stamp(entry.get("ETag", ""), entry.get("Size", ""))
        except self._client_error as exc:
            raise self._answer_error(exc, f"bucket of {self.description} does not exist") from None
        except self._failures as exc:
            raise unavailable(f"cannot list model archives in {self.description}: {exc}") from None
        return found

    def _key(self, target: str) -> str:
        return f"{self.prefix}/{target}" if self.prefix else target

    def _answer_error(self, exc: Any, missing: str) -> ModelhostError:
        """NOT_FOUND for a missing object or bucket; UNAVAILABLE with S3's reason (access denied, ...) otherwise."""
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            return not_found(missing)
        return unavailable(f"S3 refused a request for {self.description}: {exc}")


def _stamp(etag: object, size: object) -> str:
    """HeadObject's ETag and ContentLength, or a listing's ETag and Size: the same stamp either way."""
    return f"{etag}-{size}"
