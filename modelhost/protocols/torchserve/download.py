"""A model archive registered by URL (tsfs §A2.1): an http(s) URL that `allowed_urls` matches is downloaded into the
model store under the URL's file name, as TorchServe does, with a size limit and timeouts of modelhost's."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from modelhost.protocols.torchserve.config_properties import TorchServeConfig
from modelhost.protocols.torchserve.errors import TorchServeError
from modelhost.protocols.torchserve.model_store import STORE_ARCHIVE_SUFFIXES

MAX_DOWNLOAD_BYTES = 16 << 30
TIMEOUT_S = 60.0  # to connect, and between two reads
_CHUNK = 1 << 20


async def download_archive(url: str, config: TorchServeConfig) -> Path:
    """The downloaded archive's path in the model store; TorchServeError for a URL that is not allowed, a name
    already in the store, or a download that fails."""
    check_allowed(url, config)
    if config.model_store is None:
        raise TorchServeError(400, "ModelException", "no model store is set: a downloaded archive goes there")
    name = PurePosixPath(urlsplit(url).path).name
    if not name or name in (".", "..") or not name.endswith(STORE_ARCHIVE_SUFFIXES):
        raise TorchServeError(400, "DownloadArchiveException", f"{url} does not name a model archive (.mar)")
    target = config.model_store / name
    if target.exists():
        raise TorchServeError(500, "FileAlreadyExistsException", f"Model file already exists {name}")
    await asyncio.to_thread(_download, url, target)
    return target


def check_allowed(url: str, config: TorchServeConfig) -> None:
    """TorchServeError (400) unless one of `allowed_urls` matches the whole URL."""
    if not any(re.fullmatch(pattern, url) for pattern in config.allowed_urls):
        raise TorchServeError(400, "ModelException", f"Given URL {url} does not match any allowed URL(s)")


def _download(url: str, target: Path) -> None:
    descriptor, partial = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            written = 0
            while chunk := response.read(_CHUNK):
                written += len(chunk)
                if written > MAX_DOWNLOAD_BYTES:
                    raise TorchServeError(400, "DownloadArchiveException",
                                          f"{url} is larger than {MAX_DOWNLOAD_BYTES} bytes")
                out.write(chunk)
        os.link(partial, target)  # fails if the name was taken meanwhile: never overwrite
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TorchServeError(400, "DownloadArchiveException", f"Failed to download archive from: {url} "
                                                               f"({getattr(exc, 'reason', None) or exc})") from None
    finally:
        os.unlink(partial)
