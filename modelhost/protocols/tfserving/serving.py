"""TF Serving's API over the core, for its REST and gRPC front-ends alike (tsfs §B1, §B2): which version and
signature a request means, and predict, classify, regress, multi-inference, status and metadata as TF Serving
answers them.

A request names its signature (default "serving_default") and runs it through the core by name, in the shapes the
model file gives its tensors (`ModelMetadata.signatures`): a [batch]-shaped tensor takes and gives one scalar per
row, as in TF Serving. Classify and regress feed a signature of their method its serialized tf.Examples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelhost.core.dataplane import DataPlane
from modelhost.core.lifecycle import ModelState
from modelhost.core.signature import DEFAULT_SIGNATURE
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving import predict_pb2
from modelhost.protocols.tfserving.examples import example_count, serialized_examples
from modelhost.protocols.tfserving.json_codec import decode_predict_document, encode_predict, parse_predict_json
from modelhost.protocols.tfserving.metrics import TfServingMetrics
from modelhost.protocols.tfserving.signature_def import CLASSIFY_METHOD, REGRESS_METHOD
from modelhost.protocols.tfserving.tensor_proto import (
    ModelSpecInfo,
    fill_model_spec,
    model_spec_info,
    predict_inputs,
    predict_response,
)
from modelhost.types import InferRequest, ModelMetadata, RequestedOutput, SignatureSpec

CLASSIFY_INPUT = "inputs"
CLASSES_OUTPUT = "classes"
SCORES_OUTPUT = "scores"
REGRESS_OUTPUT = "outputs"

_STATES = {
    ModelState.LOADING.value: pb.ModelVersionStatus.LOADING,
    ModelState.READY.value: pb.ModelVersionStatus.AVAILABLE,
    ModelState.UNLOADING.value: pb.ModelVersionStatus.UNLOADING,
    ModelState.UNAVAILABLE.value: pb.ModelVersionStatus.END,
}


class VersionLabels:
    """Version labels by model: a label names one version (a --model_config_file's `version_labels`)."""

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, int]] = {}

    def set(self, model: str, labels: Mapping[str, int]) -> None:
        self._labels[model] = dict(labels)

    def replace(self, labels: Mapping[str, Mapping[str, int]]) -> None:
        """These labels, by model, and no others."""
        self._labels = {model: dict(named) for model, named in labels.items()}

    def version(self, model: str, label: str) -> str:
        version = self._labels.get(model, {}).get(label)
        if version is None:
            raise invalid(f"Unrecognized servable version label: {label}")
        return str(version)


class TfServing:
    """`typed_outputs`: PredictResponse tensors in their dtype's *_val field, as TF Serving writes them unless
    started with --enable_serialization_as_tensor_content (then tensor_content)."""

    def __init__(self, dataplane: DataPlane, labels: VersionLabels | None = None, typed_outputs: bool = True) -> None:
        self.dataplane = dataplane
        self.labels = labels or VersionLabels()
        self.typed_outputs = typed_outputs
        self.metrics = TfServingMetrics(dataplane.knows)

    def version(self, name: str, version: str, label: str) -> str:
        """The version a request names by number or label ("" for the latest)."""
        if version and label:
            raise invalid(f"Both model version ({version}) and model version label ({label}) cannot be supplied.")
        return self.labels.version(name, label) if label else version

    # predict

    async def predict_json(self, name: str, version: str, label: str, body: bytes) -> bytes:
        """A REST :predict, answered in the format (row or columnar) the body used."""
        document = parse_predict_json(body)
        if not isinstance(document, dict):
            raise invalid("request body must be a JSON object with 'instances' or 'inputs'")
        signature_name = signature_name_of(document)

        def decode(metadata: ModelMetadata) -> tuple[InferRequest, str]:
            signature = _signature(metadata, signature_name, rest=True)
            inputs, form = decode_predict_document(document, signature.inputs, self.dataplane.limits)
            return InferRequest(name, inputs, signature=signature_name), form

        response, form = await self.dataplane.decode_and_infer(name, self.version(name, version, label), decode)
        return encode_predict(response.outputs, form)

    async def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        """A gRPC Predict: `tensor_content` read as a view of the request's bytes, `output_filter` honoured."""
        spec = model_spec_info(request.model_spec)
        signature_name = spec.signature_name or DEFAULT_SIGNATURE
        version = self.version(spec.name, spec.version, spec.version_label)

        def decode(metadata: ModelMetadata) -> tuple[InferRequest, None]:
            signature = _signature(metadata, signature_name, rest=False)
            inputs = predict_inputs(request, signature.inputs, self.dataplane.limits)
            outputs = _output_filter(request.output_filter, signature)
            return InferRequest(spec.name, inputs, outputs=outputs, signature=signature_name), None

        response, _ = await self.dataplane.decode_and_infer(spec.name, version, decode)
        return predict_response(response.outputs, response.model_name, response.model_version,
                                signature_name=signature_name, typed=self.typed_outputs)

    # classify and regress

    async def classify(self, spec: ModelSpecInfo, source: pb.Input) -> tuple[pb.ClassificationResult, str]:
        """The classes and scores of each example, and the version that ran."""
        outputs, version = await self._run_examples(spec, source, CLASSIFY_METHOD)
        classes = outputs.get(CLASSES_OUTPUT)
        scores = outputs.get(SCORES_OUTPUT)
        result = pb.ClassificationResult()
        for row in range(example_count(source)):
            row_classes = _row(classes, row, CLASSES_OUTPUT)
            row_scores = _row(scores, row, SCORES_OUTPUT)
            if row_classes is not None and row_scores is not None and len(row_classes) != len(row_scores):
                raise ModelhostError(ErrorKind.INTERNAL, f"the signature's '{CLASSES_OUTPUT}' and '{SCORES_OUTPUT}' "
                                     "outputs have different numbers of classes")
            count = len(row_classes if row_classes is not None else row_scores)  # type: ignore[arg-type]
            classifications = result.classifications.add()
            for index in range(count):
                label = _label(row_classes[index]) if row_classes is not None else ""
                score = float(row_scores[index]) if row_scores is not None else 0.0
                classifications.classes.add(label=label, score=score)
        return result, version

    async def regress(self, spec: ModelSpecInfo, source: pb.Input) -> tuple[pb.RegressionResult, str]:
        """One value per example, and the version that ran."""
        outputs, version = await self._run_examples(spec, source, REGRESS_METHOD)
        values = outputs[REGRESS_OUTPUT]
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim != 1:
            raise ModelhostError(ErrorKind.INTERNAL, f"the signature's '{REGRESS_OUTPUT}' output has shape "
                                 f"{list(values.shape)}; a regression gives one value per example")
        result = pb.RegressionResult()
        for value in values.tolist():
            result.regressions.add(value=value)
        return result, version

    async def multi_inference(self, request: pb.MultiInferenceRequest) -> pb.MultiInferenceResponse:
        """Every task (classify or regress, one signature each, all of one model) on the same examples."""
        if not request.tasks:
            raise invalid("MultiInferenceRequest has no tasks")
        names = {task.model_spec.name for task in request.tasks}
        if len(names) > 1:
            raise invalid("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        signatures = [task.model_spec.signature_name or DEFAULT_SIGNATURE for task in request.tasks]
        if len(set(signatures)) < len(signatures):
            raise invalid("Duplicate evaluation of signature: a MultiInferenceRequest names each signature once")
        for task in request.tasks:
            if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
                raise invalid(f"Unsupported signature method_name: {task.method_name}; a task classifies "
                              f"({CLASSIFY_METHOD}) or regresses ({REGRESS_METHOD})")

        async def run(task: pb.InferenceTask) -> pb.InferenceResult:
            spec = model_spec_info(task.model_spec)
            answer = pb.InferenceResult()
            if task.method_name == CLASSIFY_METHOD:
                classified, version = await self.classify(spec, request.input)
                answer.classification_result.CopyFrom(classified)
            else:
                regressed, version = await self.regress(spec, request.input)
                answer.regression_result.CopyFrom(regressed)
            fill_model_spec(answer.model_spec, spec.name, version, spec.signature_name or DEFAULT_SIGNATURE)
            return answer

        response = pb.MultiInferenceResponse()
        response.results.extend(await asyncio.gather(*(run(task) for task in request.tasks)))
        return response

    async def _run_examples(self, spec: ModelSpecInfo, source: pb.Input,
                            method: str) -> tuple[dict[str, np.ndarray], str]:
        signature_name = spec.signature_name or DEFAULT_SIGNATURE
        version = self.version(spec.name, spec.version, spec.version_label)
        examples = serialized_examples(source, self.dataplane.limits)

        def decode(metadata: ModelMetadata) -> tuple[InferRequest, None]:
            signature = _signature(metadata, signature_name, rest=False)
            if signature.method != method:
                kind = "classification" if method == CLASSIFY_METHOD else "regression"
                raise invalid(f"Expected {kind} signature method_name to be {method}. Was: "
                              f"{signature.method or 'unknown (the model file does not say)'}")
            input_name = _examples_input(signature)
            wanted = _example_outputs(signature, method)
            return InferRequest(spec.name, {input_name: examples}, outputs=[RequestedOutput(n) for n in wanted],
                                signature=signature_name), None

        response, _ = await self.dataplane.decode_and_infer(spec.name, version, decode)
        return response.outputs, response.model_version

    # status and metadata

    def status(self, name: str, version: str = "", label: str = "") -> pb.GetModelStatusResponse:
        """Every version of the model the server knows, or the one asked for."""
        wanted = self.version(name, version, label)
        try:
            entries = [entry for entry in self.dataplane.version_states(name) if entry.version]
        except ModelhostError as exc:
            if exc.kind is not ErrorKind.NOT_FOUND:
                raise
            entries = []
        if not entries:
            raise not_found(f"Could not find any versions of model {name}")
        if wanted:
            entries = [entry for entry in entries if entry.version == wanted]
            if not entries:
                raise not_found(f"Could not find version {wanted} of model {name}")
        response = pb.GetModelStatusResponse()
        for entry in entries:
            status = response.model_version_status.add(version=int(entry.version),
                                                       state=_STATES.get(entry.state, pb.ModelVersionStatus.UNKNOWN))
            failed = entry.state == ModelState.UNAVAILABLE.value and entry.reason and entry.reason != "unloaded"
            status.status.error_code = pb.StatusProto.UNKNOWN if failed else pb.StatusProto.OK
            status.status.error_message = entry.reason if failed else ""
        return response

    def metadata(self, name: str, version: str = "", label: str = "") -> ModelMetadata:
        return self.dataplane.metadata(name, self.version(name, version, label))


def signature_name_of(document: dict[str, Any]) -> str:
    """A REST body's `signature_name` (DEFAULT_SIGNATURE when it names none)."""
    value = document.get("signature_name", "")
    if not isinstance(value, str):
        raise invalid("'signature_name' must be a string")
    return value or DEFAULT_SIGNATURE


def _signature(metadata: ModelMetadata, name: str, rest: bool) -> SignatureSpec:
    found = metadata.signatures.get(name)
    if found is None:
        if rest:
            raise invalid(f'Serving signature name: "{name}" not found in signature def')
        raise ModelhostError(ErrorKind.PRECONDITION, f'Serving signature key "{name}" not found.')
    return found


def _output_filter(names: Sequence[str], signature: SignatureSpec) -> list[RequestedOutput] | None:
    if not names:
        return None
    known = [spec.name for spec in signature.outputs]
    for name in names:
        if name not in known:
            raise invalid(f"output tensor alias not found in signature: {name} Outputs expected to be in the set "
                          f"{{{','.join(known)}}}.")
    if len(set(names)) < len(names):
        raise invalid("duplicate output tensor alias in output_filter")
    return [RequestedOutput(name) for name in names]


def _examples_input(signature: SignatureSpec) -> str:
    if len(signature.inputs) != 1 or signature.inputs[0].datatype != "BYTES":
        raise invalid("Expected one input Tensor: a classify or regress signature takes one string tensor of "
                      f"serialized tf.Examples (this one takes {', '.join(s.name for s in signature.inputs)})")
    return signature.inputs[0].name


def _example_outputs(signature: SignatureSpec, method: str) -> list[str]:
    names = {spec.name for spec in signature.outputs}
    if method == REGRESS_METHOD:
        if REGRESS_OUTPUT not in names:
            raise invalid(f"No output Tensor named '{REGRESS_OUTPUT}' in the regression signature")
        return [REGRESS_OUTPUT]
    wanted = [name for name in (CLASSES_OUTPUT, SCORES_OUTPUT) if name in names]
    if not wanted:
        raise invalid(f"Expected classification signature outputs '{CLASSES_OUTPUT}' or '{SCORES_OUTPUT}'")
    return wanted


def _row(values: np.ndarray | None, row: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    if values.ndim == 1:  # one class per example
        return values[row : row + 1]
    if values.ndim != 2:
        raise ModelhostError(ErrorKind.INTERNAL, f"the signature's '{name}' output has shape {list(values.shape)}; "
                             "expected [examples, classes]")
    row_values: np.ndarray = values[row]
    return row_values


def _label(value: Any) -> str:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return data.decode("utf-8", errors="replace")
