"""TorchServe's token authorization (tsfs §A7.3), on by default in `modelhost torchserve`: the key file, each API's
key over HTTP and gRPC, the API key's renewal, expiry, and the file's removal at stop."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

from modelhost.protocols.torchserve import inference_pb2 as ipb
from modelhost.protocols.torchserve import management_pb2 as mpb
from tests.backends.torchserve_archives import MODULE_HANDLE, make_archive
from tests.protocols.test_torchserve_grpc import INFERENCE, MANAGEMENT, Stub
from tests.server import TorchServeProcess, wait_for

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
        api = keys["API"]["key"]
        predict = f"{server.inference}/predictions/lengths"

        def renewed_key(kind: str) -> str:
            answer = requests.get(f"{server.management}/token?type={kind}", headers=bearer(api), timeout=30)
            assert answer.status_code == 200, answer.text
            return str(json.loads(key_file.read_text())[kind]["key"])

        # The keys' 3 s run from the server's start, and a loaded machine may take longer to load the model: wait
        # for it with renewed keys, then take fresh ones, which last through the checks below (milliseconds each).
        wait_for(lambda: requests.post(predict, data=b"abc", headers=bearer(renewed_key("inference")),
                                       timeout=30).status_code == 200, timeout=120, what="the model to answer")
        inference, management = renewed_key("inference"), renewed_key("management")
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
        fresh = renewed_key("inference")
        assert fresh != inference
        assert requests.post(predict, data=b"x", headers=bearer(inference), timeout=30).status_code == 400
        assert requests.post(predict, data=b"x", headers=bearer(fresh), timeout=30).status_code == 200

        grpc_keys(server, json.loads(key_file.read_text()))
        time.sleep(3.2)  # token_expiration_min=0.05: the keys last 3 s
        assert requests.post(predict, data=b"x", headers=bearer(fresh), timeout=30).json() == REFUSED
    finally:
        server.stop()
    assert not key_file.exists()


def grpc_keys(server: TorchServeProcess, keys: dict[str, Any]) -> None:
    """The gRPC services take the same keys, in the calls' `authorization` metadata."""
    def predictions() -> ipb.PredictionsRequest:
        return ipb.PredictionsRequest(model_name="lengths", input={"data": b"ab"})

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_inference_port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            Stub(channel, INFERENCE).unary("Predictions", predictions(), ipb.PredictionResponse)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        keyed = Stub(channel, INFERENCE, (("authorization", f"Bearer {keys['inference']['key']}"),))
        assert json.loads(keyed.unary("Predictions", predictions(), ipb.PredictionResponse).prediction)["length"] == 2
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_management_port}") as channel:
        wrong = Stub(channel, MANAGEMENT, (("authorization", f"Bearer {keys['inference']['key']}"),))
        with pytest.raises(grpc.RpcError) as caught:
            wrong.unary("ListModels", mpb.ListModelsRequest(), mpb.ManagementResponse)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        right = Stub(channel, MANAGEMENT, (("authorization", f"Bearer {keys['management']['key']}"),))
        listed = json.loads(right.unary("ListModels", mpb.ListModelsRequest(), mpb.ManagementResponse).msg)
        assert listed["models"][0]["modelName"] == "lengths"


def test_disabled_token_authorization_writes_no_key_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    server = TorchServeProcess(tmp_path, "--model-store", str(store), "--disable-token-auth").wait_ready()
    try:
        assert not (tmp_path / "key_file.json").exists()
        assert requests.get(f"{server.management}/models", timeout=30).json() == {"models": []}
    finally:
        server.stop()
