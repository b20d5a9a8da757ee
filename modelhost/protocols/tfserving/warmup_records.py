"""TF Serving's model warmup (tsfs §B3.4): `<version>/assets.extra/tf_serving_warmup_requests`, a TFRecord file of
serialized `PredictionLog`s, replayed on every instance before the version serves (core/warmup.py runs them).

Predict, Classify, Regress and MultiInference logs are read: a predict log's inputs for its signature, the others'
tf.Examples for the signature each names. More than 1,000 records, a truncated record or one that does not
parse is a load error naming the file and the record, as in TF Serving. The records' CRCs are not checked (the
lengths are); a corrupt record still fails to parse or to run.
"""

from __future__ import annotations

import struct
from pathlib import Path

from google.protobuf.message import DecodeError

from modelhost.config.pbtxt import ConfigError
from modelhost.core.signature import DEFAULT_SIGNATURE
from modelhost.core.warmup import WarmupSample
from modelhost.errors import ModelhostError
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving.examples import serialized_examples
from modelhost.protocols.tfserving.tensor_proto import tensor_to_array
from modelhost.types import DEFAULT_LIMITS

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_RECORDS = 1000
_HEADER = struct.Struct("<QI")  # the record's length, the masked CRC32C of the length
_FOOTER = 4  # the masked CRC32C of the record


def read_warmup_requests(version_dir: Path) -> list[WarmupSample]:
    """The warmup samples of one version directory's TF Serving warmup file; [] when it has none. Blocking."""
    path = version_dir / WARMUP_FILE
    if not path.is_file():
        return []
    try:
        records = tfrecords(path.read_bytes())
    except ValueError as exc:
        raise ConfigError(f"{WARMUP_FILE}: {exc}") from None
    if len(records) > MAX_RECORDS:
        raise ConfigError(f"{WARMUP_FILE} has {len(records)} records; at most {MAX_RECORDS} are replayed")
    samples: list[WarmupSample] = []
    for index, record in enumerate(records):
        title = f"{WARMUP_FILE} record {index + 1}"
        log = pb.PredictionLog()
        try:
            log.ParseFromString(record)
        except DecodeError as exc:
            raise ConfigError(f"{title} is not a tensorflow.serving.PredictionLog: {exc}") from None
        try:
            samples += _samples(log, title)
        except ModelhostError as exc:
            raise ConfigError(f"{title}: {exc.message}") from None
    return samples


def tfrecords(data: bytes) -> list[bytes]:
    """The records of a TFRecord file's bytes (framing only); ValueError for a truncated one."""
    records: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            raise ValueError(f"record {len(records) + 1} is truncated (its header)")
        length, _ = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        if start + length + _FOOTER > len(data):
            raise ValueError(f"record {len(records) + 1} is truncated ({length} bytes announced)")
        records.append(data[start : start + length])
        offset = start + length + _FOOTER
    return records


def _samples(log: pb.PredictionLog, title: str) -> list[WarmupSample]:
    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        request = log.predict_log.request
        budget = DEFAULT_LIMITS.budget()
        inputs = {name: tensor_to_array(tensor, f"inputs['{name}']", budget) for name, tensor in request.inputs.items()}
        return [WarmupSample(title, 0, 1, inputs, request.model_spec.signature_name or DEFAULT_SIGNATURE,
                             tuple(request.output_filter) or None)]
    if kind in ("classify_log", "regress_log"):
        examples = getattr(log, kind).request
        return [_examples_sample(title, examples.model_spec.signature_name, examples.input)]
    if kind == "multi_inference_log":
        multi = log.multi_inference_log.request
        return [_examples_sample(f"{title} task {number}", task.model_spec.signature_name, multi.input)
                for number, task in enumerate(multi.tasks, 1)]
    raise ConfigError(f"{title} is a {kind or 'empty'} log; Predict, Classify, Regress and MultiInference logs "
                      "are replayed")


def _examples_sample(title: str, signature: str, source: pb.Input) -> WarmupSample:
    return WarmupSample(title, 0, 1, {}, signature or DEFAULT_SIGNATURE,
                        examples=serialized_examples(source, DEFAULT_LIMITS))
