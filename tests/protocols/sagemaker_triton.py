"""Clients of the SageMaker Triton container's payloads, as AWS's examples write them: tritonclient builds the
binary+json body, json.dumps the octet-stream one; boto3's invoke_endpoint and the SageMaker SDK's Predictor send
them; onnxruntime gives the answers to expect."""

from __future__ import annotations

import functools
import json
from typing import Any

import boto3
import numpy as np
import onnx
import onnxruntime
import tritonclient.http as httpclient

BINARY = "application/vnd.sagemaker-triton.binary+json"
OCTET_STREAM = "application/octet-stream"


def expected(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What onnxruntime answers for `model`."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def v2_json(inputs: dict[str, np.ndarray]) -> bytes:
    """A V2 JSON inference request, as AWS's Triton examples build it (json.dumps of a dict)."""
    return json.dumps({"inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.tolist()} for name, array in inputs.items()]}).encode()


def binary_request(inputs: dict[str, np.ndarray], outputs: dict[str, bool] | None = None,
                   binary_inputs: bool = True) -> tuple[bytes, str]:
    """A binary+json body (tritonclient's generate_request_body) and its Content-Type; `outputs`: each requested
    output, and whether it is to come back binary (None: every output, binary, as tritonclient asks by default)."""
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary_inputs)
        tensors.append(tensor)
    requested = None if outputs is None else [httpclient.InferRequestedOutput(name, binary_data=binary)
                                              for name, binary in outputs.items()]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(tensors, outputs=requested)
    return body, f"{BINARY};json-header-size={header_length}"


def parse_answer(body: bytes, content_type: str) -> Any:
    """tritonclient's InferResult for an answer; its Content-Type says where the JSON header ends."""
    prefix = f"{BINARY};json-header-size="
    length = int(content_type[len(prefix):]) if content_type.startswith(prefix) else None
    assert length is not None or content_type == "application/json", content_type
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=length)


def predictor(runtime: Any, endpoint: str = "triton") -> Any:
    """The SageMaker SDK's Predictor (IdentitySerializer: application/octet-stream; BytesDeserializer) calling
    through `runtime`, a boto3 sagemaker-runtime client of a local endpoint."""
    from sagemaker.predictor import Predictor

    session = _sdk_session()
    session.sagemaker_runtime_client = runtime
    return Predictor(endpoint, sagemaker_session=session)


@functools.cache
def _sdk_session() -> Any:
    """One SDK Session for the test process: making one makes boto3 clients (most of a second)."""
    from sagemaker.session import Session

    boto = boto3.Session(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
    return Session(boto_session=boto)
