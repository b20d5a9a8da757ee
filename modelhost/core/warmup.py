"""Triton's `model_warmup`: build each sample's inputs from the config once, then run them on every instance
before the model reports ready.

What Triton does, and so do we (core `backend_model_instance.cc`, `model_config.proto`):
- a sample with `batch_size` 0 is skipped; `count` 0 runs the sample once;
- `dims` leave out the batch dim; with max_batch_size > 0 the sample runs as one batch of `batch_size`
  identical rows, so the full shape is [batch_size] + dims;
- `zero_data`: zeros (BYTES: empty strings); `random_data`: random values, except BYTES, which falls back
  to zero data; `input_data_file`: raw row-major bytes read from `<model dir>/warmup/<file>` (BYTES: each
  element a 4-byte little-endian length, then its bytes); a file shorter than dims need is an error, the
  rest of a longer one is ignored;
- a failing sample fails the load: the model never becomes ready.
Where we are stricter or differ, on purpose: samples are checked against the config when the model loads
(unknown or missing inputs, data types, dims, batch_size against max_batch_size) rather than failing
inside the backend; random data is seeded per (sample, input) so warmups are reproducible; random floats
are uniform in [0, 1) and random BOOL is 0 or 1, where Triton writes random bytes (NaN, Inf, and bool
bytes other than 0 and 1 warm nothing up and can make a healthy model fail).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.backends.base import Model
from modelhost.config.datatypes import config_type_name, v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig, ModelInput, ModelWarmup
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError
from modelhost.core.signature import DEFAULT_SIGNATURE, Signature
from modelhost.core.tensor_files import read_tensor_file
from modelhost.errors import ModelhostError
from modelhost.types import DATATYPE_DTYPES, format_shape

log = logging.getLogger("modelhost.warmup")

WARMUP_DIR = "warmup"


class WarmupError(Exception):
    """A warmup sample failed on an instance: the version must not load."""


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One warmup request, ready to run: inputs as the backend takes them (batched, reshaped). A `model_warmup`
    entry runs the served signature; another server's warmup file (`WarmupReader`) may name a signature, the
    outputs to ask for, and give `examples` (serialized tf.Examples) for that signature's one input."""

    title: str  # how messages name it: config.pbtxt model_warmup 'name' (or [index] when unnamed)
    batch_size: int
    count: int  # runs per instance, >= 1
    inputs: dict[str, np.ndarray]
    signature: str | None = None  # None: the served signature
    outputs: tuple[str, ...] | None = None  # None: all of the signature's
    examples: np.ndarray | None = None


# Warmup requests a model's version directory holds in another server's format, as samples (blocking; ConfigError
# for a file that cannot be used): TF Serving's assets.extra/tf_serving_warmup_requests.
WarmupReader = Callable[[Path], list[WarmupSample]]


def warmup_samples(config: ModelConfig, model_dir: Path) -> list[WarmupSample]:
    """Build every sample of the completed `config` once; files come from `model_dir`/warmup.

    Blocking (reads files). Raises ConfigError naming the sample and the input for anything the sample
    gets wrong. The arrays are shared by every instance's warmup and must not be written to.
    """
    samples = []
    signature: Signature | None = None
    for index, setting in enumerate(config.model_warmup):
        title = f"{CONFIG_FILENAME} model_warmup " + (f"'{setting.name}'" if setting.name else f"[{index}]")
        if setting.batch_size == 0:
            log.info("model %s: %s has batch_size 0 and is skipped (as Triton does)", config.name, title)
            continue
        signature = signature or Signature.from_config(config)
        samples.append(_build(config, signature, setting, title, model_dir))
    return samples


def run_warmup(samples: Sequence[WarmupSample], instance: Model, output_names: Sequence[str], label: str) -> None:
    """Run each sample `count` times on one instance, in config order, asking for `output_names`.

    Blocking; call it from the loader's thread for each instance before the version is ready. The outputs
    are not checked (nor are they by Triton). Raises WarmupError naming the model `label`, the sample and
    the run at the first failure.
    """
    outputs = list(output_names)
    started = time.monotonic()
    for sample in samples:
        for run in range(1, sample.count + 1):
            try:
                _run_sample(sample, instance, outputs)
            except Exception as exc:
                reason = exc.message if isinstance(exc, ModelhostError) else (str(exc) or type(exc).__name__)
                raise WarmupError(
                    f"model '{label}' failed warmup at {sample.title} (run {run} of {sample.count}): {reason}"
                ) from exc
    if samples:
        runs = sum(sample.count for sample in samples)
        log.info("model %s: %d warmup run(s) took %.1f ms", label, runs, (time.monotonic() - started) * 1e3)


def _run_sample(sample: WarmupSample, instance: Model, served_outputs: list[str]) -> None:
    name = sample.signature
    served = name is None or name == (instance.signature_name() or DEFAULT_SIGNATURE)
    if served:
        signature = instance.signature()
        outputs = list(sample.outputs or served_outputs)
    else:
        assert name is not None
        signature = instance.signatures().get(name)
        if signature is None:
            have = ", ".join(sorted(instance.signatures())) or "none"
            raise WarmupError(f"the model has no signature '{name}' (its other signatures: {have})")
        outputs = list(sample.outputs or [spec.name for spec in signature.outputs])
    inputs = sample.inputs
    if sample.examples is not None:
        if signature is None or len(signature.inputs) != 1:
            raise WarmupError(f"signature '{name}' does not take one tensor of serialized tf.Examples")
        inputs = {signature.inputs[0].name: sample.examples}
    if served:
        instance.infer(inputs, outputs)
    else:
        instance.infer_signature(name, inputs, outputs)  # type: ignore[arg-type]


def _build(config: ModelConfig, signature: Signature, setting: ModelWarmup, title: str,
           model_dir: Path) -> WarmupSample:
    batch_size = setting.batch_size
    if config.max_batch_size == 0 and batch_size != 1:
        raise ConfigError(f"{title}: batch_size {batch_size}, but the model does not batch (max_batch_size 0): "
                          "use batch_size 1")
    if batch_size > config.max_batch_size > 0:
        raise ConfigError(f"{title}: batch_size {batch_size} exceeds max_batch_size {config.max_batch_size}")
    declared = {tensor.name: tensor for tensor in config.input}
    inputs: dict[str, np.ndarray] = {}
    for name in sorted(setting.inputs):  # a map: sorted, so that errors and seeds do not depend on its order
        tensor = declared.get(name)
        if tensor is None:
            raise ConfigError(f"{title}: input '{name}' is not an input of the model; its inputs are "
                              + ", ".join(f"'{n}'" for n in declared))
        where = f"{title} input '{name}'"
        row = _row(setting.inputs[name], tensor, where, zlib.crc32(f"{title}\0{name}".encode()), model_dir)
        inputs[name] = np.repeat(row[np.newaxis], batch_size, axis=0) if config.max_batch_size > 0 else row
    missing = [t.name for t in config.input if not t.optional and t.name not in inputs]
    if missing:
        raise ConfigError(f"{title} gives no data for input(s) " + ", ".join(f"'{n}'" for n in missing))
    try:
        feeds, _ = signature.check_inputs(inputs)
    except ModelhostError as exc:
        raise ConfigError(f"{title}: {exc.message}") from None
    for array in feeds.values():
        array.flags.writeable = False  # shared by every instance's runs: a backend writing one would show at once
    return WarmupSample(title, batch_size, max(setting.count, 1), feeds)


def _row(spec: ModelWarmup.Input, tensor: ModelInput, where: str, seed: int, model_dir: Path) -> np.ndarray:
    """The data of one batch row (shape `dims`), checked against the config's input."""
    if spec.data_type != tensor.data_type:
        given = config_type_name(spec.data_type) if spec.data_type else "no data_type"
        raise ConfigError(f"{where} has {given}, but the model's input is {config_type_name(tensor.data_type)}")
    datatype = v2_datatype(tensor.data_type)
    dims = tuple(int(d) for d in spec.dims)
    expected = tuple(tensor.dims)
    if any(d < 0 for d in dims):
        raise ConfigError(f"{where} has dims {format_shape(dims)}: warmup needs every dim given (no -1)")
    if len(dims) != len(expected) or any(e not in (-1, d) for e, d in zip(expected, dims)):
        raise ConfigError(f"{where} has dims {format_shape(dims)}, but the model's input has dims "
                          f"{format_shape(expected)} (dims leave out the batch dimension)")
    dtype = DATATYPE_DTYPES[datatype]
    choice = spec.WhichOneof("input_data_type")
    if choice is None:
        raise ConfigError(f"{where} sets none of zero_data, random_data, input_data_file")
    if choice == "input_data_file":
        return read_tensor_file(model_dir, WARMUP_DIR, spec.input_data_file, datatype, dims, where, "input_data_file")
    if choice == "zero_data" or datatype == "BYTES":
        return np.full(dims, b"", dtype=object) if datatype == "BYTES" else np.zeros(dims, dtype)
    return _random(dtype, dims, seed)


def _random(dtype: np.dtype, dims: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=dims).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=dims, dtype=dtype, endpoint=True)
    return rng.random(size=dims).astype(dtype)
