"""The core's request limits (types.ElementBudget, JSON depth, output bytes, duplicate outputs), client-visible
messages without server paths, the client log rate limiter, and the settings and flags that set them."""

from __future__ import annotations

import asyncio
import io
import logging

import numpy as np
import orjson
import pytest

from modelhost import client_log as client_log_module
from modelhost.access import Api
from modelhost.cli import modelhost_settings
from modelhost.client_log import BURST, LogRateLimiter, client_log
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.core.signature import Signature, check_output_bytes
from modelhost.errors import ErrorKind, ModelhostError, hide_paths_under, public_message
from modelhost.protocols.http.app import HttpApp, HttpRequest, HttpResponse, Route
from modelhost.protocols.json_numbers import json_numbers
from modelhost.protocols.kserve_v2 import codec, grpc_codec
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.sagemaker.npy_payload import decode_npy
from modelhost.protocols.tfserving import predict_pb2 as tf
from modelhost.protocols.tfserving.json_codec import decode_predict
from modelhost.protocols.tfserving.tensor_proto import tensor_to_array
from modelhost.settings import ServerSettings, SettingsError, request_limits
from modelhost.settings_checks import check_settings
from modelhost.types import MAX_RANK, RequestedOutput, RequestLimits, TensorSpec


def refused(*fragments: str) -> pytest.RaisesExc:
    return pytest.raises(ModelhostError, match="(?s)" + "".join(f"(?=.*{fragment})" for fragment in fragments))


def nested(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def v2(shape: list[int], data: object, datatype: str = "FP32") -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]})


def test_budget_counts_every_tensor_of_a_request() -> None:
    budget = RequestLimits(max_elements=10).budget()
    assert budget.take("input 'a'", (2, 3)) == 6
    assert budget.take("input 'b'", (0, 5)) == 0
    with refused("input 'c'", r"\[5\]", "5 elements", "10", "--max-request-elements"):
        budget.take("input 'c'", (5,))


def test_budget_refuses_ranks_numpy_cannot_hold_and_empty_shapes_that_overflow() -> None:
    budget = RequestLimits().budget()
    assert budget.take("t", (1,) * 64) == 1
    with refused("'t'", "65 dimensions", "64"):
        budget.take("'t'", (1,) * 65)
    with refused("'t'", "non-zero sizes multiply"):
        budget.take("'t'", (0, 2**40, 2**40))
    assert budget.take("t", (0, 1000)) == 0


@pytest.mark.parametrize("datatype", ["INT64", "UINT8", "FP32", "BOOL", "BYTES"])
def test_json_deeper_than_the_limit_is_refused_for_every_datatype(datatype: str) -> None:
    leaf = {"BOOL": True, "BYTES": "a", "FP32": 1.5}.get(datatype, 1)
    deep = MAX_RANK + 6
    with refused("'x'", f"{deep} lists deep", rf"maximum allowed limit \({MAX_RANK}\)", "--json-max-depth"):
        codec.decode_infer_request(v2([1], nested(deep, leaf), datatype), None, "m")
    shallow = codec.decode_infer_request(v2([1], nested(MAX_RANK, leaf), datatype), None, "m")
    assert shallow.inputs["x"].shape == (1,)


@pytest.mark.skipif(MAX_RANK < 50, reason="numpy 1 holds 32 dims")
@pytest.mark.parametrize(("datatype", "leaf"), [("BYTES", "hello"), ("INT64", 123)])
def test_json_nested_50_deep_for_a_shape_of_one_element_decodes_as_triton_does(datatype: str, leaf: object) -> None:
    """Triton's qa/L0_http: data nested 50 lists deep for shape [1, 1] is accepted (its limit is 100)."""
    request = codec.decode_infer_request(v2([1, 1], nested(50, leaf), datatype), None, "m")
    assert request.inputs["x"].shape == (1, 1)


def test_integers_nested_past_32_levels_decode_when_the_limit_allows() -> None:
    """numpy's object-array iteration stops at 32 dims; the integer check must not (it gave a 500)."""
    array = json_numbers(nested(40, 7), "INT64", "input 'x'", max_depth=64)
    assert array.ndim == 40 and array.reshape(-1).tolist() == [7]


def test_v2_and_grpc_shapes_are_checked_before_allocating() -> None:
    limits = RequestLimits(max_elements=100)
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [101],
                                       "parameters": {"binary_data_size": 0}}]})
    with refused("'x'", "101 elements", "100"):
        codec.decode_infer_request(header, len(header), "m", limits=limits)
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2**40, 2**40]).contents.fp32_contents.append(1.0)
    with refused("'x'", "--max-request-elements"):
        grpc_codec.decode_infer_request(message, limits)


def test_tensor_proto_filled_from_one_value_is_bounded() -> None:
    """TF Serving fills a shape from one typed value: a 10-byte message must not become terabytes."""
    proto = tf.TensorProto(dtype=tf.DT_FLOAT, float_val=[1.0])
    for size in (2**20, 2**20):
        proto.tensor_shape.dim.add(size=size)
    with refused("inputs\\['x'\\]", "1099511627776 elements"):
        tensor_to_array(proto, "inputs['x']")
    small = tf.TensorProto(dtype=tf.DT_FLOAT, float_val=[2.0])
    small.tensor_shape.dim.add(size=3)
    assert tensor_to_array(small, "t").tolist() == [2.0, 2.0, 2.0]


def test_tfserving_json_counts_elements_and_depth() -> None:
    spec = [TensorSpec("x", "FP32", (-1, -1))]
    with refused("'instances'", "input 'x'", "--max-request-elements"):
        decode_predict(orjson.dumps({"instances": [[1.0] * 6] * 2}), spec, RequestLimits(max_elements=10))
    with refused("instances\\[0\\]", "lists deep"):
        decode_predict(orjson.dumps({"instances": [nested(MAX_RANK + 6, 1.0)]}), [TensorSpec("x", "FP32", (-1,))])


def test_npy_is_a_view_of_the_body_after_its_header_is_checked() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(8, dtype=np.float32).reshape(2, 4))
    array = decode_npy(buffer.getvalue(), TensorSpec("x", "FP32", (-1, 4)))
    assert array.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    fortran = io.BytesIO()
    np.save(fortran, np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)))
    assert decode_npy(fortran.getvalue(), TensorSpec("x", "INT64", (-1, 3))).tolist() == [[0, 1, 2], [3, 4, 5]]
    with refused("53 bytes of data", "needs 48"):
        decode_npy(fortran.getvalue() + b"x" * 5, TensorSpec("x", "INT64", (-1, 3)))


def signature() -> Signature:
    config = ModelConfig(name="m", max_batch_size=4)
    config.input.add(name="x", data_type=11, dims=[4])  # TYPE_FP32
    config.output.add(name="y", data_type=11, dims=[4])
    config.output.add(name="z", data_type=11, dims=[4])
    return Signature.from_config(config)


def test_an_output_requested_twice_is_refused() -> None:
    assert signature().check_outputs([RequestedOutput("z"), RequestedOutput("y")]) == ["z", "y"]
    with refused("output 'y'", "already exists in request", "twice"):
        signature().check_outputs([RequestedOutput("y"), RequestedOutput("z"), RequestedOutput("y")])


def test_output_bytes_limit() -> None:
    outputs = {"y": np.zeros((2, 4), np.float32), "z": np.zeros((2, 4), np.float32)}
    check_output_bytes(outputs, 64)
    with refused("output 'z'", r"\[2,4\]", "63 bytes", "--max-output-bytes"):
        check_output_bytes(outputs, 63)
    strings = {"s": np.array([b"a" * 40, b"b" * 40], dtype=object)}
    check_output_bytes(strings, 80)
    with refused("output 's'", "BYTES"):
        check_output_bytes(strings, 79)


def test_public_messages_have_no_server_paths(tmp_path: object) -> None:
    hide_paths_under("/srv/models-for-test")
    text = ("Load model from /srv/models-for-test/tiny/1/model.onnx failed; see "
            "/usr/lib/python3/x/torch/serialization.py and s3://bucket/a/b as application/json")
    assert public_message(text) == ("Load model from tiny/1/model.onnx failed; see serialization.py and "
                                    "s3://bucket/a/b as application/json")
    assert public_message("input 'x' has shape [1,4]") == "input 'x' has shape [1,4]"


def test_rate_limiter_lets_bursts_through_and_counts_the_rest() -> None:
    now = [0.0]
    limiter = LogRateLimiter(2.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(5)] == [0, 0, 0, None, None]
    assert limiter.allow("b") == 0  # kinds are limited apart
    now[0] += 0.5  # one token back
    assert limiter.allow("a") == 2
    assert limiter.allow("a") is None
    silent = LogRateLimiter(0.0)
    assert silent.allow("a") is None


def test_client_log_writes_the_summary_line(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    now = [0.0]
    monkeypatch.setattr(client_log_module, "_limiter", LogRateLimiter(1.0, clock=lambda: now[0]))
    logger = logging.getLogger("modelhost.test_client_log")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for index in range(25):
            client_log(logger, logging.WARNING, "test-kind", "bad request %d", index)
        now[0] += 1.0
        client_log(logger, logging.WARNING, "test-kind", "bad request %d", 25)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"bad request {i}" for i in range(BURST)] + [
        "suppressed 15 similar messages (test-kind)", "bad request 25"]


def test_flags_set_the_limits() -> None:
    settings = modelhost_settings(["serve", "--json-max-depth", "8", "--max-request-elements", "1000",
                                   "--max-output-bytes", "1MiB", "--client-log-lines-per-second", "0.5"], {})
    assert request_limits(settings) == RequestLimits(1000, 8, 1024**2)
    assert settings.client_log_lines_per_second == 0.5
    defaults = ServerSettings()
    assert request_limits(defaults) == RequestLimits()
    assert defaults.max_request_elements * 4 >= 500 * 1000 * 4 * 100  # 100x a 500 x 1000 FP32 batch
    for bad in ({"json_max_depth": 65}, {"json_max_depth": 0}, {"max_request_elements": 0},
                {"max_output_bytes": -1}, {"client_log_lines_per_second": -1.0}):
        with pytest.raises(SettingsError):
            check_settings(ServerSettings(**bad))  # type: ignore[arg-type]


def test_errors_keep_their_kind() -> None:
    with pytest.raises(ModelhostError) as raised:
        codec.decode_infer_request(v2([1] * 65, [1.0]), None, "m")
    assert raised.value.kind is ErrorKind.INVALID_INPUT


def test_http_500_names_the_exception_type_only(caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception's text (paths, internals) goes to the log; the client gets its type."""
    async def broken(request: HttpRequest) -> HttpResponse:
        raise RuntimeError("cannot read /srv/secret/models/x/model.py")

    app = HttpApp([Route("GET", "/boom", broken, Api.INFERENCE)])
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/boom", "headers": []}
    with caplog.at_level(logging.ERROR, logger="modelhost.http"):
        asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 500
    body = orjson.loads(sent[1]["body"])  # type: ignore[arg-type]
    assert body == {"error": "internal error (RuntimeError); the server log has the details"}
    assert "/srv/secret/models/x/model.py" in caplog.text


def test_max_rank_is_the_installed_numpys() -> None:
    # 64 dims in numpy 2, 32 in numpy 1 (which the project also takes): a shape or JSON nesting past what the
    # installed numpy holds is a 400 naming the limit, not numpy's ValueError (a 500).
    np.empty((1,) * MAX_RANK)
    with pytest.raises(ValueError):
        np.empty((1,) * (MAX_RANK + 1))
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * (MAX_RANK + 1),
                                       "parameters": {"binary_data_size": 4}}]})
    with refused("'x'", f"at most {MAX_RANK}"):
        codec.decode_infer_request(header + bytes(4), len(header), "m")
    text = b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ' + orjson.dumps(
        nested(MAX_RANK + 1, "a")) + b"}]}"
    with refused("'x'", "nested"):
        codec.decode_infer_request(text, None, "m", limits=RequestLimits(max_json_depth=MAX_RANK))
    assert modelhost_settings(["serve", "--json-max-depth", str(MAX_RANK)], {}).json_max_depth == MAX_RANK
