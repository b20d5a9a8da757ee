"""A Triton Python model's model loading API (pb_utils.load_model, unload_model, is_model_ready) in explicit model
control mode: one server (module scope) started with only the loader models loaded. The models are
test_triton_python_api.py's."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.backends.test_python_server import write_model
from tests.backends.test_triton_python_api import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    ISOLATED,
    LOADER,
    LOADER_CONFIG,
    model_loading_call,
)
from tests.server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("triton_loading_repo")
    write_model(repo, "loader", LOADER_CONFIG, LOADER)
    write_model(repo, "loader_isolated", LOADER_CONFIG + ISOLATED, LOADER)
    write_model(repo, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    process = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "loader",
                            "--load-model", "loader_isolated")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.mark.parametrize("model", ["loader", "loader_isolated"])
def test_load_and_unload_another_model(server: ServerProcess, model: str) -> None:
    assert model_loading_call(server.url, model, "ready add_sub") == "False"
    assert model_loading_call(server.url, model, "load add_sub") == "None"
    assert model_loading_call(server.url, model, "ready add_sub") == "True"
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    for data in inputs:
        data.set_data_from_numpy(np.ones(4, np.float32))
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), np.full(4, 2, np.float32))
    assert model_loading_call(server.url, model, "unload add_sub") == "None"
    assert model_loading_call(server.url, model, "ready add_sub") == "False"
    assert not client.is_model_ready("add_sub")


def test_files_it_uploads_are_code_the_policy_judges(server: ServerProcess) -> None:
    # A model.py sent as load_model's files is an upload: the default --user-code repository refuses it, as it
    # refuses a client's.
    answer = model_loading_call(server.url, "loader", "upload uploaded")
    assert answer.startswith("error: ") and "--user-code repository" in answer, answer
    assert model_loading_call(server.url, "loader", "ready uploaded") == "False"
