"""A model's signatures as TF Serving's metadata shows them: `SignatureDefMap` (tsfs §B1.2, §B2).

Every model has them: a SavedModel's are its own (with their method names); any other model's one signature is
"serving_default", a predict signature, named by its config. A tensor's `name` is its key: modelhost calls
signatures by key, never by graph tensor name.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving.tensor_proto import data_type_of
from modelhost.types import ModelMetadata, SignatureSpec, TensorSpec

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# The type URL TF Serving's GetModelMetadataResponse packs the map under (its package, not modelhost's).
SIGNATURE_DEF_MAP_URL = "type.googleapis.com/tensorflow.serving.SignatureDefMap"


def signature_def_map(metadata: ModelMetadata) -> pb.SignatureDefMap:
    result = pb.SignatureDefMap()
    for name, signature in metadata.signatures.items():
        _fill(result.signature_def[name], signature)
    return result


def _fill(definition: pb.SignatureDef, signature: SignatureSpec) -> None:
    definition.method_name = signature.method or PREDICT_METHOD
    for specs, target in ((signature.inputs, definition.inputs), (signature.outputs, definition.outputs)):
        for spec in specs:
            _fill_tensor(target[spec.name], spec)


def _fill_tensor(info: pb.TensorInfo, spec: TensorSpec) -> None:
    info.name = spec.name
    info.dtype = data_type_of(spec.datatype)  # type: ignore[assignment]
    for size in spec.shape:
        info.tensor_shape.dim.add(size=size)


def metadata_json(metadata: ModelMetadata) -> dict[str, Any]:
    """The REST metadata body: model_spec, and metadata.signature_def holding the SignatureDefMap's JSON (hence
    the doubled key). Fields at their defaults are written, as TF Serving writes them (`"name": ""`)."""
    signature_defs = json_format.MessageToDict(signature_def_map(metadata), preserving_proto_field_name=True,
                                               always_print_fields_with_no_presence=True)
    return {
        "model_spec": {"name": metadata.name, "signature_name": "", "version": metadata.version},
        "metadata": {"signature_def": signature_defs},
    }
