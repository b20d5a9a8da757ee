from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from modelhost.protocols.tfserving import predict_pb2 as _predict_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BytesList(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, value: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FloatList(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, value: _Optional[_Iterable[float]] = ...) -> None: ...

class Int64List(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, value: _Optional[_Iterable[int]] = ...) -> None: ...

class Feature(_message.Message):
    __slots__ = ("bytes_list", "float_list", "int64_list")
    BYTES_LIST_FIELD_NUMBER: _ClassVar[int]
    FLOAT_LIST_FIELD_NUMBER: _ClassVar[int]
    INT64_LIST_FIELD_NUMBER: _ClassVar[int]
    bytes_list: BytesList
    float_list: FloatList
    int64_list: Int64List
    def __init__(self, bytes_list: _Optional[_Union[BytesList, _Mapping]] = ..., float_list: _Optional[_Union[FloatList, _Mapping]] = ..., int64_list: _Optional[_Union[Int64List, _Mapping]] = ...) -> None: ...

class Features(_message.Message):
    __slots__ = ("feature",)
    class FeatureEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Feature
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Feature, _Mapping]] = ...) -> None: ...
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    feature: _containers.MessageMap[str, Feature]
    def __init__(self, feature: _Optional[_Mapping[str, Feature]] = ...) -> None: ...

class Example(_message.Message):
    __slots__ = ("features",)
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    features: Features
    def __init__(self, features: _Optional[_Union[Features, _Mapping]] = ...) -> None: ...

class ExampleList(_message.Message):
    __slots__ = ("examples",)
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    examples: _containers.RepeatedCompositeFieldContainer[Example]
    def __init__(self, examples: _Optional[_Iterable[_Union[Example, _Mapping]]] = ...) -> None: ...

class ExampleListWithContext(_message.Message):
    __slots__ = ("examples", "context")
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    examples: _containers.RepeatedCompositeFieldContainer[Example]
    context: Example
    def __init__(self, examples: _Optional[_Iterable[_Union[Example, _Mapping]]] = ..., context: _Optional[_Union[Example, _Mapping]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("example_list", "example_list_with_context")
    EXAMPLE_LIST_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_LIST_WITH_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    example_list: ExampleList
    example_list_with_context: ExampleListWithContext
    def __init__(self, example_list: _Optional[_Union[ExampleList, _Mapping]] = ..., example_list_with_context: _Optional[_Union[ExampleListWithContext, _Mapping]] = ...) -> None: ...

class Class(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Classifications(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[Class]
    def __init__(self, classes: _Optional[_Iterable[_Union[Class, _Mapping]]] = ...) -> None: ...

class ClassificationResult(_message.Message):
    __slots__ = ("classifications",)
    CLASSIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    classifications: _containers.RepeatedCompositeFieldContainer[Classifications]
    def __init__(self, classifications: _Optional[_Iterable[_Union[Classifications, _Mapping]]] = ...) -> None: ...

class ClassificationRequest(_message.Message):
    __slots__ = ("model_spec", "input")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    input: Input
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class ClassificationResponse(_message.Message):
    __slots__ = ("model_spec", "result")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    result: ClassificationResult
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., result: _Optional[_Union[ClassificationResult, _Mapping]] = ...) -> None: ...

class Regression(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: float
    def __init__(self, value: _Optional[float] = ...) -> None: ...

class RegressionResult(_message.Message):
    __slots__ = ("regressions",)
    REGRESSIONS_FIELD_NUMBER: _ClassVar[int]
    regressions: _containers.RepeatedCompositeFieldContainer[Regression]
    def __init__(self, regressions: _Optional[_Iterable[_Union[Regression, _Mapping]]] = ...) -> None: ...

class RegressionRequest(_message.Message):
    __slots__ = ("model_spec", "input")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    input: Input
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class RegressionResponse(_message.Message):
    __slots__ = ("model_spec", "result")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    result: RegressionResult
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., result: _Optional[_Union[RegressionResult, _Mapping]] = ...) -> None: ...

class InferenceTask(_message.Message):
    __slots__ = ("model_spec", "method_name")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    METHOD_NAME_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    method_name: str
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., method_name: _Optional[str] = ...) -> None: ...

class InferenceResult(_message.Message):
    __slots__ = ("model_spec", "classification_result", "regression_result")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_RESULT_FIELD_NUMBER: _ClassVar[int]
    REGRESSION_RESULT_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    classification_result: ClassificationResult
    regression_result: RegressionResult
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., classification_result: _Optional[_Union[ClassificationResult, _Mapping]] = ..., regression_result: _Optional[_Union[RegressionResult, _Mapping]] = ...) -> None: ...

class MultiInferenceRequest(_message.Message):
    __slots__ = ("tasks", "input")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[InferenceTask]
    input: Input
    def __init__(self, tasks: _Optional[_Iterable[_Union[InferenceTask, _Mapping]]] = ..., input: _Optional[_Union[Input, _Mapping]] = ...) -> None: ...

class MultiInferenceResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[InferenceResult]
    def __init__(self, results: _Optional[_Iterable[_Union[InferenceResult, _Mapping]]] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("name", "dtype", "tensor_shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _predict_pb2.DataType
    tensor_shape: _predict_pb2.TensorShapeProto
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_predict_pb2.DataType, str]] = ..., tensor_shape: _Optional[_Union[_predict_pb2.TensorShapeProto, _Mapping]] = ...) -> None: ...

class SignatureDef(_message.Message):
    __slots__ = ("inputs", "outputs", "method_name", "defaults")
    class InputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TensorInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TensorInfo, _Mapping]] = ...) -> None: ...
    class OutputsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TensorInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TensorInfo, _Mapping]] = ...) -> None: ...
    class DefaultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _predict_pb2.TensorProto
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_predict_pb2.TensorProto, _Mapping]] = ...) -> None: ...
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    METHOD_NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.MessageMap[str, TensorInfo]
    outputs: _containers.MessageMap[str, TensorInfo]
    method_name: str
    defaults: _containers.MessageMap[str, _predict_pb2.TensorProto]
    def __init__(self, inputs: _Optional[_Mapping[str, TensorInfo]] = ..., outputs: _Optional[_Mapping[str, TensorInfo]] = ..., method_name: _Optional[str] = ..., defaults: _Optional[_Mapping[str, _predict_pb2.TensorProto]] = ...) -> None: ...

class SignatureDefMap(_message.Message):
    __slots__ = ("signature_def",)
    class SignatureDefEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SignatureDef
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SignatureDef, _Mapping]] = ...) -> None: ...
    SIGNATURE_DEF_FIELD_NUMBER: _ClassVar[int]
    signature_def: _containers.MessageMap[str, SignatureDef]
    def __init__(self, signature_def: _Optional[_Mapping[str, SignatureDef]] = ...) -> None: ...

class GetModelMetadataRequest(_message.Message):
    __slots__ = ("model_spec", "metadata_field")
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    metadata_field: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., metadata_field: _Optional[_Iterable[str]] = ...) -> None: ...

class GetModelMetadataResponse(_message.Message):
    __slots__ = ("model_spec", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _any_pb2.Any
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    metadata: _containers.MessageMap[str, _any_pb2.Any]
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ..., metadata: _Optional[_Mapping[str, _any_pb2.Any]] = ...) -> None: ...

class StatusProto(_message.Message):
    __slots__ = ("error_code", "error_message")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OK: _ClassVar[StatusProto.Code]
        CANCELLED: _ClassVar[StatusProto.Code]
        UNKNOWN: _ClassVar[StatusProto.Code]
        INVALID_ARGUMENT: _ClassVar[StatusProto.Code]
        DEADLINE_EXCEEDED: _ClassVar[StatusProto.Code]
        NOT_FOUND: _ClassVar[StatusProto.Code]
        ALREADY_EXISTS: _ClassVar[StatusProto.Code]
        PERMISSION_DENIED: _ClassVar[StatusProto.Code]
        RESOURCE_EXHAUSTED: _ClassVar[StatusProto.Code]
        FAILED_PRECONDITION: _ClassVar[StatusProto.Code]
        ABORTED: _ClassVar[StatusProto.Code]
        OUT_OF_RANGE: _ClassVar[StatusProto.Code]
        UNIMPLEMENTED: _ClassVar[StatusProto.Code]
        INTERNAL: _ClassVar[StatusProto.Code]
        UNAVAILABLE: _ClassVar[StatusProto.Code]
        DATA_LOSS: _ClassVar[StatusProto.Code]
        UNAUTHENTICATED: _ClassVar[StatusProto.Code]
    OK: StatusProto.Code
    CANCELLED: StatusProto.Code
    UNKNOWN: StatusProto.Code
    INVALID_ARGUMENT: StatusProto.Code
    DEADLINE_EXCEEDED: StatusProto.Code
    NOT_FOUND: StatusProto.Code
    ALREADY_EXISTS: StatusProto.Code
    PERMISSION_DENIED: StatusProto.Code
    RESOURCE_EXHAUSTED: StatusProto.Code
    FAILED_PRECONDITION: StatusProto.Code
    ABORTED: StatusProto.Code
    OUT_OF_RANGE: StatusProto.Code
    UNIMPLEMENTED: StatusProto.Code
    INTERNAL: StatusProto.Code
    UNAVAILABLE: StatusProto.Code
    DATA_LOSS: StatusProto.Code
    UNAUTHENTICATED: StatusProto.Code
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: StatusProto.Code
    error_message: str
    def __init__(self, error_code: _Optional[_Union[StatusProto.Code, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ModelVersionStatus(_message.Message):
    __slots__ = ("version", "state", "status")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[ModelVersionStatus.State]
        START: _ClassVar[ModelVersionStatus.State]
        LOADING: _ClassVar[ModelVersionStatus.State]
        AVAILABLE: _ClassVar[ModelVersionStatus.State]
        UNLOADING: _ClassVar[ModelVersionStatus.State]
        END: _ClassVar[ModelVersionStatus.State]
    UNKNOWN: ModelVersionStatus.State
    START: ModelVersionStatus.State
    LOADING: ModelVersionStatus.State
    AVAILABLE: ModelVersionStatus.State
    UNLOADING: ModelVersionStatus.State
    END: ModelVersionStatus.State
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: ModelVersionStatus.State
    status: StatusProto
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[ModelVersionStatus.State, str]] = ..., status: _Optional[_Union[StatusProto, _Mapping]] = ...) -> None: ...

class GetModelStatusRequest(_message.Message):
    __slots__ = ("model_spec",)
    MODEL_SPEC_FIELD_NUMBER: _ClassVar[int]
    model_spec: _predict_pb2.ModelSpec
    def __init__(self, model_spec: _Optional[_Union[_predict_pb2.ModelSpec, _Mapping]] = ...) -> None: ...

class GetModelStatusResponse(_message.Message):
    __slots__ = ("model_version_status",)
    MODEL_VERSION_STATUS_FIELD_NUMBER: _ClassVar[int]
    model_version_status: _containers.RepeatedCompositeFieldContainer[ModelVersionStatus]
    def __init__(self, model_version_status: _Optional[_Iterable[_Union[ModelVersionStatus, _Mapping]]] = ...) -> None: ...

class ServableVersionPolicy(_message.Message):
    __slots__ = ("latest", "all", "specific")
    class Latest(_message.Message):
        __slots__ = ("num_versions",)
        NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
        num_versions: int
        def __init__(self, num_versions: _Optional[int] = ...) -> None: ...
    class All(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Specific(_message.Message):
        __slots__ = ("versions",)
        VERSIONS_FIELD_NUMBER: _ClassVar[int]
        versions: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...
    LATEST_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    SPECIFIC_FIELD_NUMBER: _ClassVar[int]
    latest: ServableVersionPolicy.Latest
    all: ServableVersionPolicy.All
    specific: ServableVersionPolicy.Specific
    def __init__(self, latest: _Optional[_Union[ServableVersionPolicy.Latest, _Mapping]] = ..., all: _Optional[_Union[ServableVersionPolicy.All, _Mapping]] = ..., specific: _Optional[_Union[ServableVersionPolicy.Specific, _Mapping]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "base_path", "model_type", "model_platform", "model_version_policy", "version_labels")
    class VersionLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_path: str
    model_type: int
    model_platform: str
    model_version_policy: ServableVersionPolicy
    version_labels: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., base_path: _Optional[str] = ..., model_type: _Optional[int] = ..., model_platform: _Optional[str] = ..., model_version_policy: _Optional[_Union[ServableVersionPolicy, _Mapping]] = ..., version_labels: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ModelConfigList(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    def __init__(self, config: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ...) -> None: ...

class ModelServerConfig(_message.Message):
    __slots__ = ("model_config_list", "custom_model_config")
    MODEL_CONFIG_LIST_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_MODEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    model_config_list: ModelConfigList
    custom_model_config: _any_pb2.Any
    def __init__(self, model_config_list: _Optional[_Union[ModelConfigList, _Mapping]] = ..., custom_model_config: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class ReloadConfigRequest(_message.Message):
    __slots__ = ("config", "metric_names")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    METRIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    config: ModelServerConfig
    metric_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, config: _Optional[_Union[ModelServerConfig, _Mapping]] = ..., metric_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("name", "int64_value_increase")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INT64_VALUE_INCREASE_FIELD_NUMBER: _ClassVar[int]
    name: str
    int64_value_increase: int
    def __init__(self, name: _Optional[str] = ..., int64_value_increase: _Optional[int] = ...) -> None: ...

class ReloadConfigResponse(_message.Message):
    __slots__ = ("status", "metric")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    status: StatusProto
    metric: _containers.RepeatedCompositeFieldContainer[Metric]
    def __init__(self, status: _Optional[_Union[StatusProto, _Mapping]] = ..., metric: _Optional[_Iterable[_Union[Metric, _Mapping]]] = ...) -> None: ...

class BatchingParameters(_message.Message):
    __slots__ = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads", "thread_pool_name", "allowed_batch_sizes", "pad_variable_length_inputs", "enable_large_batch_splitting", "max_execution_batch_size")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TIMEOUT_MICROS_FIELD_NUMBER: _ClassVar[int]
    MAX_ENQUEUED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCH_THREADS_FIELD_NUMBER: _ClassVar[int]
    THREAD_POOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    PAD_VARIABLE_LENGTH_INPUTS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_LARGE_BATCH_SPLITTING_FIELD_NUMBER: _ClassVar[int]
    MAX_EXECUTION_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: _wrappers_pb2.Int64Value
    batch_timeout_micros: _wrappers_pb2.Int64Value
    max_enqueued_batches: _wrappers_pb2.Int64Value
    num_batch_threads: _wrappers_pb2.Int64Value
    thread_pool_name: _wrappers_pb2.StringValue
    allowed_batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    pad_variable_length_inputs: bool
    enable_large_batch_splitting: _wrappers_pb2.BoolValue
    max_execution_batch_size: _wrappers_pb2.Int64Value
    def __init__(self, max_batch_size: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., batch_timeout_micros: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., max_enqueued_batches: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., num_batch_threads: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ..., thread_pool_name: _Optional[_Union[_wrappers_pb2.StringValue, _Mapping]] = ..., allowed_batch_sizes: _Optional[_Iterable[int]] = ..., pad_variable_length_inputs: bool = ..., enable_large_batch_splitting: _Optional[_Union[_wrappers_pb2.BoolValue, _Mapping]] = ..., max_execution_batch_size: _Optional[_Union[_wrappers_pb2.Int64Value, _Mapping]] = ...) -> None: ...

class PrometheusConfig(_message.Message):
    __slots__ = ("enable", "path")
    ENABLE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    enable: bool
    path: str
    def __init__(self, enable: bool = ..., path: _Optional[str] = ...) -> None: ...

class MonitoringConfig(_message.Message):
    __slots__ = ("prometheus_config",)
    PROMETHEUS_CONFIG_FIELD_NUMBER: _ClassVar[int]
    prometheus_config: PrometheusConfig
    def __init__(self, prometheus_config: _Optional[_Union[PrometheusConfig, _Mapping]] = ...) -> None: ...

class PredictLog(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: _predict_pb2.PredictRequest
    response: _predict_pb2.PredictResponse
    def __init__(self, request: _Optional[_Union[_predict_pb2.PredictRequest, _Mapping]] = ..., response: _Optional[_Union[_predict_pb2.PredictResponse, _Mapping]] = ...) -> None: ...

class ClassifyLog(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: ClassificationRequest
    response: ClassificationResponse
    def __init__(self, request: _Optional[_Union[ClassificationRequest, _Mapping]] = ..., response: _Optional[_Union[ClassificationResponse, _Mapping]] = ...) -> None: ...

class RegressLog(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: RegressionRequest
    response: RegressionResponse
    def __init__(self, request: _Optional[_Union[RegressionRequest, _Mapping]] = ..., response: _Optional[_Union[RegressionResponse, _Mapping]] = ...) -> None: ...

class MultiInferenceLog(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: MultiInferenceRequest
    response: MultiInferenceResponse
    def __init__(self, request: _Optional[_Union[MultiInferenceRequest, _Mapping]] = ..., response: _Optional[_Union[MultiInferenceResponse, _Mapping]] = ...) -> None: ...

class PredictionLog(_message.Message):
    __slots__ = ("classify_log", "regress_log", "multi_inference_log", "predict_log")
    CLASSIFY_LOG_FIELD_NUMBER: _ClassVar[int]
    REGRESS_LOG_FIELD_NUMBER: _ClassVar[int]
    MULTI_INFERENCE_LOG_FIELD_NUMBER: _ClassVar[int]
    PREDICT_LOG_FIELD_NUMBER: _ClassVar[int]
    classify_log: ClassifyLog
    regress_log: RegressLog
    multi_inference_log: MultiInferenceLog
    predict_log: PredictLog
    def __init__(self, classify_log: _Optional[_Union[ClassifyLog, _Mapping]] = ..., regress_log: _Optional[_Union[RegressLog, _Mapping]] = ..., multi_inference_log: _Optional[_Union[MultiInferenceLog, _Mapping]] = ..., predict_log: _Optional[_Union[PredictLog, _Mapping]] = ...) -> None: ...
