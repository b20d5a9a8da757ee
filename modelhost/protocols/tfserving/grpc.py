"""TF Serving's gRPC services (tsfs §B2): `tensorflow.serving.PredictionService` (Predict, Classify, Regress,
MultiInference, GetModelMetadata) and `tensorflow.serving.ModelService` (GetModelStatus), registered by TF
Serving's names on the server's gRPC port, over modelhost's own messages (apis.proto, predict.proto).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from modelhost.access import Api
from modelhost.core.signature import DEFAULT_SIGNATURE
from modelhost.errors import ErrorKind, ModelhostError, invalid
from modelhost.protocols.grpc_service import Service, Unary
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving import predict_pb2
from modelhost.protocols.tfserving.examples import example_count
from modelhost.protocols.tfserving.serving import TfServing
from modelhost.protocols.tfserving.signature_def import SIGNATURE_DEF_MAP_URL, signature_def_map
from modelhost.protocols.tfserving.tensor_proto import fill_model_spec, model_spec_info

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SIGNATURE_DEF_FIELD = "signature_def"
Reload = Callable[[pb.ModelServerConfig], Awaitable[None]]
R = TypeVar("R", pb.ClassificationResponse, pb.RegressionResponse)


def services(serving: TfServing, reload: Reload | None = None) -> list[Service]:
    """`reload` applies a HandleReloadConfigRequest's model list (modelhost tfserving); None: the server serves
    a repository, which the RPC cannot change."""
    counted = serving.metrics.request

    async def predict(request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        with counted(request.model_spec.name, "Predict", "GRPC"):
            return await serving.predict(request)

    async def classify(request: pb.ClassificationRequest) -> pb.ClassificationResponse:
        return await _examples_call(request, "Classify", serving.classify, pb.ClassificationResponse())

    async def regress(request: pb.RegressionRequest) -> pb.RegressionResponse:
        return await _examples_call(request, "Regress", serving.regress, pb.RegressionResponse())

    async def _examples_call(request: Any, api: str, run: Callable[..., Awaitable[tuple[Any, str]]],
                             response: R) -> R:
        """Classify or Regress: the result of `run` on the request's tf.Examples, in `response` with its ModelSpec."""
        spec = model_spec_info(request.model_spec)
        with counted(spec.name, api, "GRPC", example_count(request.input)):
            result, version = await run(spec, request.input)
        response.result.CopyFrom(result)
        fill_model_spec(response.model_spec, spec.name, version, spec.signature_name or DEFAULT_SIGNATURE)
        return response

    async def multi_inference(request: pb.MultiInferenceRequest) -> pb.MultiInferenceResponse:
        model = request.tasks[0].model_spec.name if request.tasks else ""
        with counted(model, "MultiInference", "GRPC", example_count(request.input)):
            return await serving.multi_inference(request)

    async def get_model_metadata(request: pb.GetModelMetadataRequest) -> pb.GetModelMetadataResponse:
        if not request.metadata_field:
            raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != SIGNATURE_DEF_FIELD:
                raise invalid(f"Metadata field {field} is not supported")
        spec = model_spec_info(request.model_spec)
        metadata = serving.metadata(spec.name, spec.version, spec.version_label)
        response = pb.GetModelMetadataResponse()
        fill_model_spec(response.model_spec, metadata.name, metadata.version, "")
        packed = response.metadata[SIGNATURE_DEF_FIELD]
        packed.type_url = SIGNATURE_DEF_MAP_URL
        packed.value = signature_def_map(metadata).SerializeToString()
        return response

    async def get_model_status(request: pb.GetModelStatusRequest) -> pb.GetModelStatusResponse:
        spec = model_spec_info(request.model_spec)
        return serving.status(spec.name, spec.version, spec.version_label)

    async def handle_reload_config(request: pb.ReloadConfigRequest) -> pb.ReloadConfigResponse:
        if reload is None:
            raise ModelhostError(ErrorKind.PRECONDITION, "this server serves a model repository (modelhost serve); "
                                 "HandleReloadConfigRequest changes the model list of modelhost tfserving")
        await reload(request.config)
        return pb.ReloadConfigResponse(status=pb.StatusProto(error_code=pb.StatusProto.OK))

    return [
        Service(PREDICTION_SERVICE, [
            Unary("Predict", predict_pb2.PredictRequest, predict, Api.INFERENCE),
            Unary("Classify", pb.ClassificationRequest, classify, Api.INFERENCE),
            Unary("Regress", pb.RegressionRequest, regress, Api.INFERENCE),
            Unary("MultiInference", pb.MultiInferenceRequest, multi_inference, Api.INFERENCE),
            Unary("GetModelMetadata", pb.GetModelMetadataRequest, get_model_metadata, Api.METADATA),
        ]),
        Service(MODEL_SERVICE, [
            Unary("GetModelStatus", pb.GetModelStatusRequest, get_model_status, Api.HEALTH),
            Unary("HandleReloadConfigRequest", pb.ReloadConfigRequest, handle_reload_config, Api.MODEL_REPOSITORY),
        ]),
    ]
