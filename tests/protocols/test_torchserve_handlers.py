"""TorchServe's own handlers, unmodified, behind `modelhost torchserve`: the built-in `base_handler` by name on an
eager-mode model (`--model-file` and a state dict) under TorchServe's JSON envelope, and a BaseHandler subclass on
a TorchScript model, both built by torch-model-archiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.backends.torchserve_archives import make_archive
from tests.server import TorchServeProcess

pytest.importorskip("ts")
torch = pytest.importorskip("torch")

EAGER_MODEL = '''
import torch


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x)
'''
# A BaseHandler subclass that reads comma-separated rows (the envelope hands it each instance, its b64 decoded):
# BaseHandler loads the TorchScript file, runs inference under inference_mode and returns tolist() per instance.
ROW_HANDLER = '''
import torch
from ts.torch_handler.base_handler import BaseHandler


class Rows(BaseHandler):
    def preprocess(self, data):
        return torch.tensor([[float(v) for v in bytes(row).decode().split(",")] for row in data])
'''


class Scorer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


@pytest.fixture(scope="module")
def scorer() -> Scorer:
    torch.manual_seed(7)
    return Scorer().eval()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, scorer: Scorer) -> Iterator[TorchServeProcess]:
    root = tmp_path_factory.mktemp("torchserve_handlers")
    store = root / "store"
    store.mkdir()
    torch.save(scorer.state_dict(), root / "scorer.pth")
    make_archive(store, "eager", "base_handler", serialized=root / "scorer.pth", model_file=EAGER_MODEL)
    torch.jit.script(scorer).save(str(root / "scripted.pt"))
    make_archive(store, "scripted", ROW_HANDLER, serialized=root / "scripted.pt")
    process = TorchServeProcess(root, "--model-store", str(store), "--models", "eager.mar", "scripted.mar",
                                properties="disable_token_authorization=true\ndefault_workers_per_model=1\n"
                                           "service_envelope=json\n")
    process.wait_ready()
    yield process
    process.stop()


def test_the_built_in_base_handler_runs_an_eager_model_in_the_json_envelope(server: TorchServeProcess,
                                                                             scorer: Scorer) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 2.0]]
    response = requests.post(f"{server.inference}/predictions/eager", json={"instances": rows}, timeout=60)
    assert response.status_code == 200, response.text
    expected = scorer(torch.tensor(rows)).tolist()
    predictions = response.json()["predictions"]
    assert [[round(v, 5) for v in row] for row in predictions] == [[round(v, 5) for v in row] for row in expected]


def test_a_base_handler_subclass_runs_a_torchscript_model(server: TorchServeProcess, scorer: Scorer) -> None:
    response = requests.post(f"{server.inference}/predictions/scripted", json={"instances": [{"b64": "MSwyLDMsNA=="}]},
                             timeout=60)
    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    expected = scorer(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist()[0]
    assert [round(v, 5) for v in prediction] == [round(v, 5) for v in expected]


def test_archives_unpack_in_their_own_directory_and_go_at_stop(server: TorchServeProcess) -> None:
    unpacked = list(Path(server.temporary).glob("modelhost-mar-*"))
    assert len(unpacked) == 2
