"""modelhost's own TF Serving messages against tensorflow-serving-api's: every field modelhost declares has the
official field's number, type and label, so the bytes on the wire are the same (tsfs §B2). (The wheel has no
BatchingParameters or MonitoringConfig: those are read as text, and test_tfserving_config.py reads TF Serving's
own examples of them.)"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor

pytest.importorskip("tensorflow_serving")

from tensorflow.core.example import example_pb2, feature_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    input_pb2,
    model_management_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
    status_pb2,  # noqa: E402
)
from tensorflow_serving.config import file_system_storage_path_source_pb2, model_server_config_pb2  # noqa: E402

from modelhost.protocols.tfserving import apis_pb2 as ours  # noqa: E402
from modelhost.protocols.tfserving import predict_pb2 as ours_predict  # noqa: E402

# Fields modelhost leaves out on purpose (it never reads them); every other official field must be declared.
LEFT_OUT = {
    "TensorInfo": {"coo_sparse", "composite_tensor"},
    "ModelConfig": {"logging_config"},
    "PredictionLog": {"log_metadata", "session_run_log", "predict_streamed_log"},
    "PredictRequest": {"predict_streamed_options", "client_id", "request_options"},
}

PAIRS = [
    (ours.BytesList, feature_pb2.BytesList), (ours.FloatList, feature_pb2.FloatList),
    (ours.Int64List, feature_pb2.Int64List), (ours.Feature, feature_pb2.Feature), (ours.Features, feature_pb2.Features),
    (ours.Example, example_pb2.Example),
    (ours.ExampleList, input_pb2.ExampleList), (ours.ExampleListWithContext, input_pb2.ExampleListWithContext),
    (ours.Input, input_pb2.Input),
    (ours.Class, classification_pb2.Class), (ours.Classifications, classification_pb2.Classifications),
    (ours.ClassificationResult, classification_pb2.ClassificationResult),
    (ours.ClassificationRequest, classification_pb2.ClassificationRequest),
    (ours.ClassificationResponse, classification_pb2.ClassificationResponse),
    (ours.Regression, regression_pb2.Regression), (ours.RegressionResult, regression_pb2.RegressionResult),
    (ours.RegressionRequest, regression_pb2.RegressionRequest),
    (ours.RegressionResponse, regression_pb2.RegressionResponse),
    (ours.InferenceTask, inference_pb2.InferenceTask), (ours.InferenceResult, inference_pb2.InferenceResult),
    (ours.MultiInferenceRequest, inference_pb2.MultiInferenceRequest),
    (ours.MultiInferenceResponse, inference_pb2.MultiInferenceResponse),
    (ours.TensorInfo, meta_graph_pb2.TensorInfo), (ours.SignatureDef, meta_graph_pb2.SignatureDef),
    (ours.SignatureDefMap, get_model_metadata_pb2.SignatureDefMap),
    (ours.GetModelMetadataRequest, get_model_metadata_pb2.GetModelMetadataRequest),
    (ours.GetModelMetadataResponse, get_model_metadata_pb2.GetModelMetadataResponse),
    (ours.StatusProto, status_pb2.StatusProto), (ours.ModelVersionStatus, get_model_status_pb2.ModelVersionStatus),
    (ours.GetModelStatusRequest, get_model_status_pb2.GetModelStatusRequest),
    (ours.GetModelStatusResponse, get_model_status_pb2.GetModelStatusResponse),
    (ours.ServableVersionPolicy, file_system_storage_path_source_pb2.FileSystemStoragePathSourceConfig
     .ServableVersionPolicy),
    (ours.ModelConfig, model_server_config_pb2.ModelConfig),
    (ours.ModelConfigList, model_server_config_pb2.ModelConfigList),
    (ours.ModelServerConfig, model_server_config_pb2.ModelServerConfig),
    (ours.ReloadConfigRequest, model_management_pb2.ReloadConfigRequest),
    (ours.Metric, model_management_pb2.Metric), (ours.ReloadConfigResponse, model_management_pb2.ReloadConfigResponse),
    (ours.PredictLog, prediction_log_pb2.PredictLog), (ours.ClassifyLog, prediction_log_pb2.ClassifyLog),
    (ours.RegressLog, prediction_log_pb2.RegressLog), (ours.MultiInferenceLog, prediction_log_pb2.MultiInferenceLog),
    (ours.PredictionLog, prediction_log_pb2.PredictionLog),
    (ours_predict.ModelSpec, model_pb2.ModelSpec), (ours_predict.PredictRequest, predict_pb2.PredictRequest),
    (ours_predict.PredictResponse, predict_pb2.PredictResponse),
]


def _fields(descriptor: Descriptor) -> dict[str, tuple[int, int, bool]]:
    # The wire type follows the field's type (an enum and an int32 are both varints) and packing.
    def wire(field):  # type: ignore[no-untyped-def]
        enum_as_int = {field.TYPE_ENUM: field.TYPE_INT32}
        return enum_as_int.get(field.type, field.type)

    return {f.name: (f.number, wire(f), f.is_repeated) for f in descriptor.fields}


@pytest.mark.parametrize("mine, theirs", PAIRS, ids=[p[0].DESCRIPTOR.name for p in PAIRS])
def test_fields_match_tensorflow_serving(mine, theirs) -> None:  # type: ignore[no-untyped-def]
    ours_fields, official = _fields(mine.DESCRIPTOR), _fields(theirs.DESCRIPTOR)
    left_out = LEFT_OUT.get(mine.DESCRIPTOR.name, set())
    assert set(official) - set(ours_fields) == left_out
    for name, field in ours_fields.items():
        assert official[name] == field, name
