"""modelhost's triton_python_backend_utils (backends/python/triton_utils.py) on its own: what a model.py calls
between the server's requests and its responses."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.backends.python import triton_utils as pb


def test_type_names_and_numbers_as_tritons() -> None:
    assert pb.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb.triton_to_numpy_type(8) is np.int32  # DataType TYPE_INT32 = 8
    assert pb.numpy_to_triton_type(np.float16) == 10  # TYPE_FP16
    assert pb.numpy_to_triton_type(np.complex64) is None


def test_bytes_wire_form_round_trips() -> None:
    values = np.array([b"ab", b"", "\u00e9".encode()], dtype=np.object_)
    wire = pb.serialize_byte_tensor(values)
    assert wire.tobytes()[:6] == b"\x02\x00\x00\x00ab"
    assert list(pb.deserialize_bytes_tensor(wire.tobytes())) == list(values)


def test_config_lookups() -> None:
    config = {"input": [{"name": "a", "data_type": "TYPE_INT32"}], "output": [{"name": "b"}],
              "model_transaction_policy": {"decoupled": True}}
    assert pb.get_input_config_by_name(config, "a") == {"name": "a", "data_type": "TYPE_INT32"}
    assert pb.get_output_config_by_name(config, "a") is None
    assert pb.using_decoupled_model_transaction_policy(config)
    assert not pb.using_decoupled_model_transaction_policy({})


def test_tensors_and_responses() -> None:
    tensor = pb.Tensor("t", np.array(["x", "yz"]))  # str arrays become BYTES' object arrays
    assert tensor.as_numpy().dtype == np.object_ and tensor.shape() == [2] and tensor.is_cpu()
    copied = pb.Tensor.from_dlpack("c", np.arange(3, dtype=np.int64))
    assert copied.name() == "c" and list(copied.as_numpy()) == [0, 1, 2]
    with pytest.raises(pb.TritonError, match="numpy array"):
        pb.Tensor("bad", [1, 2])
    response = pb.InferenceResponse([copied], error=None)
    assert pb.get_output_tensor_by_name(response, "c") is copied and not response.has_error()
    error = pb.TritonError("no")
    assert error.code() == pb.TritonError.INTERNAL and pb.InferenceResponse(error=error).error() is error


def test_dlpack_capsules_round_trip_through_torch_sharing_memory() -> None:
    # Triton's examples (qa/python_models/identity_bf16, dlpack_*): Tensor.from_dlpack(name, to_dlpack(t)) and back.
    import torch
    import torch.utils.dlpack

    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tensor = pb.Tensor.from_dlpack("t", torch.utils.dlpack.to_dlpack(source))
    assert tensor.as_numpy().tolist() == source.tolist()
    source[0, 0] = 9  # shared, not copied
    assert tensor.as_numpy()[0, 0] == 9
    back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert back.tolist() == source.tolist()
    request_input = np.arange(3, dtype=np.int32)
    request_input.setflags(write=False)  # as a request's inputs are
    assert torch.utils.dlpack.from_dlpack(pb.Tensor("in", request_input).to_dlpack()).tolist() == [0, 1, 2]
    with pytest.raises(pb.TritonError, match="tensor 'x': from_dlpack cannot read it"):
        pb.Tensor.from_dlpack("x", object())


def test_a_sender_closes_with_the_final_flag() -> None:
    sent: list[tuple[object, bool]] = []
    sender = pb.InferenceResponseSender(lambda response, final: sent.append((response, final)), lambda: False)
    with pytest.raises(pb.TritonError, match="only with TRITONSERVER_RESPONSE_COMPLETE_FINAL"):
        sender.send()
    sender.send(pb.InferenceResponse())
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb.TritonError, match="closed"):
        sender.send(pb.InferenceResponse())
    assert [final for _, final in sent] == [False, True] and not sender.is_cancelled()


def test_requests_without_a_server() -> None:
    request = pb.InferenceRequest("m", ["y"], [pb.Tensor("x", np.ones(2))], "id1", parameters={"k": 1})
    assert request.parameters() == '{"k": 1}' and request.request_id() == "id1"
    with pytest.raises(pb.TritonError, match="decoupled"):
        request.get_response_sender()
    with pytest.raises(pb.TritonError, match="reschedule"):
        request.set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    pb.connect(pb.BlsHost())  # no server: a BLS call is answered with an error response, not an exception
    answer = request.exec()
    assert answer.has_error() and answer.error().code() == pb.TritonError.UNSUPPORTED
