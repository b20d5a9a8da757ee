"""TorchServe's token authorization (tsfs §A7.3), on unless `disable_token_authorization`: three keys written at
start to `key_file.json` in the server's working directory (mode 0600, removed at stop). The inference key opens
the inference API, the management key the management API (each expires after `token_expiration_min`), and the API
key `GET /token?type=management|inference` on the management port, which replaces that key and its expiry.
A request sends `Authorization: Bearer <key>`; gRPC calls the same in their `authorization` metadata."""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import secrets
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

KEY_FILE = "key_file.json"
INFERENCE, MANAGEMENT, API = "inference", "management", "API"
FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
_BEARER = re.compile(r"^Bearer\s+(\S+)$")


class TokenKeys:
    """The keys of one server, and its key file."""

    def __init__(self, directory: Path, expiration_minutes: float) -> None:
        self.path = directory / KEY_FILE
        self._lifetime_s = expiration_minutes * 60
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, float | None]] = {API: (_new_key(), None)}
        for kind in (MANAGEMENT, INFERENCE):
            self._keys[kind] = (_new_key(), time.time() + self._lifetime_s)
        self._write()

    def allows(self, kind: str, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries the valid, unexpired key of `kind`."""
        match = _BEARER.match(authorization or "")
        if match is None:
            return False
        key, expires = self._keys[kind]
        return hmac.compare_digest(match.group(1), key) and (expires is None or time.time() < expires)

    def renew(self, kind: str) -> None:
        """A new key of `kind` (inference or management), with a new expiry, written to the key file."""
        with self._lock:
            self._keys[kind] = (_new_key(), time.time() + self._lifetime_s)
            self._write()

    def remove(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass

    def _write(self) -> None:
        document = {kind: {"key": key, **({"expiration time": _instant(expires)} if expires is not None else {})}
                    for kind, (key, expires) in ((k, self._keys[k]) for k in (MANAGEMENT, INFERENCE, API))}
        temporary = self.path.with_name(f".{KEY_FILE}.new")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump(document, file, indent=2)
        os.replace(temporary, self.path)


def _new_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(6)).decode()


def _instant(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")
