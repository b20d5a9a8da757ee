"""TorchServe's token authorization (tsfs §A7.3), on by default in `modelhost torchserve`: the key file, each API's
key, the API key's renewal, expiry, and the file's removal at stop."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
import requests

from tests.backends.torchserve_archives import MODULE_HANDLE, make_archive
from tests.server import TorchServeProcess

pytest.importorskip("ts")

REFUSED = {"code": 400, "type": "InvalidKeyException",
           "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_each_api_takes_its_own_key_and_the_api_key_renews_them(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    make_archive(store, "lengths", MODULE_HANDLE)
    server = TorchServeProcess(tmp_path, "--model-store", str(store), "--models", "lengths.mar",
                               properties="default_workers_per_model=1\ntoken_expiration_min=0.05\n")
    key_file = tmp_path / "key_file.json"
    try:
        server.wait_ready(path=f"{server.metrics}/metrics")  # the metrics port takes no token
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        keys = json.loads(key_file.read_text())
        assert set(keys) == {"management", "inference", "API"} and len(keys["inference"]["key"]) == 8
        assert keys["inference"]["expiration time"].endswith("Z") and "expiration time" not in keys["API"]
        inference, management, api = (keys[k]["key"] for k in ("inference", "management", "API"))

        predict = f"{server.inference}/predictions/lengths"
        assert requests.post(predict, data=b"abc", timeout=30).json() == REFUSED
        assert requests.get(f"{server.inference}/ping", timeout=30).status_code == 400
        assert requests.post(predict, data=b"abc", headers=bearer(management), timeout=30).json() == REFUSED
        answer = requests.post(predict, data=b"abc", headers=bearer(inference), timeout=30)
        assert answer.status_code == 200 and json.loads(answer.content)["length"] == 3
        models = f"{server.management}/models"
        assert requests.get(models, headers=bearer(inference), timeout=30).json() == REFUSED
        assert requests.get(models, headers=bearer(management), timeout=30).status_code == 200

        wrong = requests.get(f"{server.management}/token?type=inference", headers=bearer(management), timeout=30)
        assert wrong.status_code == 400 and wrong.json()["message"].startswith("Token Authentication failed")
        renewed = requests.get(f"{server.management}/token?type=inference", headers=bearer(api), timeout=30)
        assert renewed.status_code == 200
        fresh = json.loads(key_file.read_text())["inference"]["key"]
        assert fresh != inference
        assert requests.post(predict, data=b"x", headers=bearer(inference), timeout=30).status_code == 400
        assert requests.post(predict, data=b"x", headers=bearer(fresh), timeout=30).status_code == 200

        time.sleep(3.2)  # token_expiration_min=0.05: the keys last 3 s
        assert requests.post(predict, data=b"x", headers=bearer(fresh), timeout=30).json() == REFUSED
    finally:
        server.stop()
    assert not key_file.exists()


def test_disabled_token_authorization_writes_no_key_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    server = TorchServeProcess(tmp_path, "--model-store", str(store), "--disable-token-auth").wait_ready()
    try:
        assert not (tmp_path / "key_file.json").exists()
        assert requests.get(f"{server.management}/models", timeout=30).json() == {"models": []}
    finally:
        server.stop()
