"""TensorflowBackend on SavedModels this module writes, checked against the same SavedModels run by TF directly."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from modelhost.backends.base import InstanceSettings, ModelSignature  # noqa: E402
from modelhost.backends.tensorflow import TensorflowBackend  # noqa: E402
from modelhost.config.completion import complete_config  # noqa: E402
from modelhost.config.model_config_pb2 import ModelConfig  # noqa: E402
from modelhost.config.pbtxt import ConfigError  # noqa: E402
from modelhost.core.model_loading import load_version, plan_model  # noqa: E402
from modelhost.errors import ErrorKind, ModelhostError  # noqa: E402
from modelhost.store.local import LocalStore  # noqa: E402
from modelhost.types import TensorSpec  # noqa: E402

_REPO = Path(__file__).resolve().parents[2]
WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2) / 4


class _Dense(tf.Module):
    """serving_default: x [batch, 3] FP32 -> y = x @ W, total = row sums; "upper": strings s -> upper, length."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(WEIGHTS)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x: Any) -> dict[str, Any]:
        return {"y": tf.matmul(x, self.w), "total": tf.reduce_sum(x, axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
    def upper(self, s: Any) -> dict[str, Any]:
        return {"upper": tf.strings.upper(s), "length": tf.strings.length(s)}


def save_dense_model(path: Path) -> Path:
    """Write the _Dense SavedModel (signatures serving_default and upper) to `path`; return it."""
    module = _Dense()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "upper": module.upper})
    return path


def run_directly(path: Path, signature: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """What TF itself answers for the SavedModel's signature."""
    function = tf.saved_model.load(str(path)).signatures[signature]
    return {name: tensor.numpy() for name, tensor in function(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


def _save_v1_model(path: Path) -> Path:
    """A TF1 (SavedModelBuilder) export, as an estimator-era TF Serving model: inputs [batch, 2] -> scores."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        scores = tf.identity(x * 2.0 + 1.0, name="scores")
        builder = tf.compat.v1.saved_model.Builder(str(path))
        signature = tf.compat.v1.saved_model.predict_signature_def({"inputs": x}, {"scores": scores})
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    return path


class _Odd(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def complex_out(self, x: Any) -> dict[str, Any]:
        return {"c": tf.complex(x, x)}

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def any_rank(self, x: Any) -> dict[str, Any]:
        return {"y": x}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("savedmodels")
    odd = _Odd()
    tf.saved_model.save(odd, str(root / "odd"), signatures={"complex": odd.complex_out, "any_rank": odd.any_rank})
    return {"dense": save_dense_model(root / "dense"), "v1": _save_v1_model(root / "v1"), "odd": root / "odd"}


def _config(instances: int = 1, **parameters: str) -> ModelConfig:
    config = ModelConfig(name="m", platform="tensorflow_savedmodel")
    config.instance_group.add(count=instances)
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


def _load(path: Path, **parameters: str) -> Any:
    return TensorflowBackend().load(path, _config(**parameters), InstanceSettings(0, 1))


DENSE_SIGNATURE = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (-1, 3)),),
    outputs=(TensorSpec("total", "FP32", (-1,)), TensorSpec("y", "FP32", (-1, 2))),
    method="tensorflow/serving/predict",
)


def test_describe_reads_serving_default_with_none_dims_as_minus_one(models: dict[str, Path]) -> None:
    assert TensorflowBackend().describe(models["dense"]) == DENSE_SIGNATURE


def test_describe_reads_a_named_signature_with_string_tensors(models: dict[str, Path]) -> None:
    signature = TensorflowBackend().describe(models["dense"], "upper")
    assert signature.inputs == (TensorSpec("s", "BYTES", (-1,)),)
    assert signature.outputs == (TensorSpec("length", "INT32", (-1,)), TensorSpec("upper", "BYTES", (-1,)))


@pytest.mark.parametrize("batch", [1, 5])
def test_infer_matches_tensorflow_run_directly(models: dict[str, Path], batch: int) -> None:
    model = _load(models["dense"])
    x = np.random.default_rng(batch).normal(size=(batch, 3)).astype(np.float32)
    results = model.infer({"x": x}, ["y", "total"])
    expected = run_directly(models["dense"], "serving_default", x=x)
    assert set(results) == {"y", "total"}
    for name in ("y", "total"):
        assert results[name].dtype == np.float32 and results[name].shape == expected[name].shape
        np.testing.assert_array_equal(results[name], expected[name])
    np.testing.assert_allclose(results["y"], x @ WEIGHTS, rtol=1e-6)


def test_infer_returns_the_requested_outputs(models: dict[str, Path]) -> None:
    results = _load(models["dense"]).infer({"x": np.ones((2, 3), np.float32)}, ["total"])
    np.testing.assert_array_equal(results["total"], [3.0, 3.0])


def test_loaded_signature_completes_a_missing_config(models: dict[str, Path]) -> None:
    model = _load(models["dense"])
    assert model.signature() == DENSE_SIGNATURE
    signature = model.signature()
    config = complete_config(_config(), signature.inputs, signature.outputs, "1/model.savedmodel", 4)
    assert config.max_batch_size == 4
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [3])]
    assert [(t.name, list(t.dims), t.HasField("reshape")) for t in config.output] == [
        ("total", [1], True), ("y", [2], False)]


def test_named_signature_runs_string_tensors_as_bytes_object_arrays(models: dict[str, Path]) -> None:
    model = _load(models["dense"], TF_SIGNATURE_DEF="upper")
    assert model.signature() == TensorflowBackend().describe(models["dense"], "upper")
    s = np.array([b"abc", b"", b"mixed Case", b"\xff\xfe not utf-8"], dtype=object)
    results = model.infer({"s": s}, ["upper", "length"])
    expected = run_directly(models["dense"], "upper", s=s)
    assert results["upper"].dtype == np.object_ and all(isinstance(v, bytes) for v in results["upper"])
    assert results["upper"].tolist() == expected["upper"].tolist()
    assert results["upper"].tolist() == [b"ABC", b"", b"MIXED CASE", b"\xff\xfe NOT UTF-8"]
    assert results["length"].dtype == np.int32
    np.testing.assert_array_equal(results["length"], expected["length"])


def test_other_signatures_run_by_name_beside_the_served_one(models: dict[str, Path]) -> None:
    model = _load(models["dense"])
    assert model.signature_name() == "serving_default"
    assert model.signatures() == {"upper": TensorflowBackend().describe(models["dense"], "upper")}
    results = model.infer_signature("upper", {"s": np.array([b"ab"], dtype=object)}, ["upper"])
    assert results["upper"].tolist() == [b"AB"]
    served = _load(models["dense"], TF_SIGNATURE_DEF="upper")
    assert served.signature_name() == "upper" and set(served.signatures()) == {"serving_default"}


def test_signatures_modelhost_cannot_serve_are_left_out(tmp_path: Path) -> None:
    odd = _Odd()
    module = _Dense()
    tf.saved_model.save(module, str(tmp_path / "mixed"),
                        signatures={"serving_default": module.serve, "complex": odd.complex_out,
                                    "any_rank": odd.any_rank})
    model = _load(tmp_path / "mixed")
    assert model.signatures() == {}
    assert model.signature() == DENSE_SIGNATURE


def test_empty_string_batch(models: dict[str, Path]) -> None:
    results = _load(models["dense"], TF_SIGNATURE_DEF="upper").infer({"s": np.array([], dtype=object)}, ["upper"])
    assert results["upper"].shape == (0,) and results["upper"].dtype == np.object_


def test_tf1_saved_model_loads_and_matches_tensorflow(models: dict[str, Path]) -> None:
    model = _load(models["v1"])
    assert model.signature() == ModelSignature(
        inputs=(TensorSpec("inputs", "FP32", (-1, 2)),), outputs=(TensorSpec("scores", "FP32", (-1, 2)),),
        method="tensorflow/serving/predict")
    x = np.array([[1.0, 2.0], [-3.0, 0.5]], np.float32)
    results = model.infer({"inputs": x}, ["scores"])
    np.testing.assert_array_equal(results["scores"], run_directly(models["v1"], "serving_default", inputs=x)["scores"])
    np.testing.assert_array_equal(results["scores"], x * 2 + 1)


def test_not_a_saved_model_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "model.savedmodel"
    path.mkdir()
    with pytest.raises(ConfigError, match=r"model\.savedmodel is not a SavedModel directory"):
        _load(path)
    with pytest.raises(ConfigError, match="not a SavedModel"):
        TensorflowBackend().describe(path)


def test_missing_signature_names_the_ones_the_model_has(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(models["dense"], TF_SIGNATURE_DEF="predict")
    message = str(caught.value)
    assert str(models["dense"]) in message and "no signature 'predict'" in message
    assert "its signatures: serving_default, upper" in message


def test_missing_serving_default_is_a_config_error(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="no signature 'serving_default' .*its signatures: any_rank, complex"):
        TensorflowBackend().describe(models["odd"])


def test_unknown_graph_tag_is_a_config_error(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"cannot load SavedModel .*dense \(tag 'gpu'\)"):
        _load(models["dense"], TF_GRAPH_TAG="gpu")


def test_unservable_dtype_and_unknown_rank_are_config_errors(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="signature 'complex' output 'c' has dtype complex64"):
        TensorflowBackend().describe(models["odd"], "complex")
    with pytest.raises(ConfigError, match="signature 'any_rank' input 'x' has unknown rank"):
        _load(models["odd"], TF_SIGNATURE_DEF="any_rank")


def test_bad_thread_parameter_is_a_config_error(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="parameter TF_NUM_INTRA_THREADS must be an integer >= 0, got 'many'"):
        _load(models["dense"], TF_NUM_INTRA_THREADS="many")


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": np.ones((2, 3), np.float64)}, "expected to be a float tensor but is a double tensor"),
        ({"x": np.ones((2, 4), np.float32)}, "^tensorflow: Matrix size-incompatible"),
        ({"z": np.ones((2, 3), np.float32)}, "missing a required argument: 'x'"),
    ],
    ids=["dtype", "shape", "name"],
)
def test_caller_errors_are_invalid_input(models: dict[str, Path], inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ModelhostError, match=message) as caught:
        _load(models["dense"]).infer(inputs, ["y"])
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_non_string_objects_in_a_string_input_are_invalid_input(models: dict[str, Path]) -> None:
    model = _load(models["dense"], TF_SIGNATURE_DEF="upper")
    with pytest.raises(ModelhostError, match="input 's': tensorflow needs bytes or str") as caught:
        model.infer({"s": np.array([b"a", 3], dtype=object)}, ["upper"])
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_a_versions_instances_share_one_loaded_saved_model_and_run_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three instances (TF Serving's num_batch_threads) load the SavedModel once, as TF Serving's batch threads share
    one session, and run at once on their threads with each answer its own."""
    save_dense_model(tmp_path / "m" / "1" / "model.savedmodel")
    (tmp_path / "m" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'
                                                 "instance_group [ { count: 3 kind: KIND_CPU } ]\n")
    loads: list[str] = []
    load = tf.saved_model.load
    monkeypatch.setattr(tf.saved_model, "load", lambda path, **kw: loads.append(path) or load(path, **kw))
    source = LocalStore(tmp_path).fetch("m")
    served = load_version(source, 1, plan_model(source), cpu_count=3, default_max_batch_size=4)
    try:
        instances = [instance for instance, _ in served.scheduler._instances]  # type: ignore[attr-defined]
        assert len(instances) == 3 and len(loads) == 1
        inputs = [np.full((2, 3), float(i), np.float32) for i in range(30)]
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda item: instances[item[0] % 3].infer({"x": item[1]}, ["y"])["y"],
                                    enumerate(inputs)))
        for x, y in zip(inputs, answers, strict=True):
            np.testing.assert_allclose(y, x @ WEIGHTS, rtol=1e-6)
        instances[0].unload()
        np.testing.assert_allclose(instances[1].infer({"x": inputs[1]}, ["y"])["y"], inputs[1] @ WEIGHTS, rtol=1e-6)
    finally:
        asyncio.run(served.scheduler.stop())


def test_unload_drops_the_instance(models: dict[str, Path]) -> None:
    model = _load(models["dense"])
    model.unload()
    assert model.signature() is None


# TF's thread pools are process-wide and fixed once its runtime starts, which this process did long ago:
# each case runs in a fresh interpreter that loads two models, like a server's first and second TF models.
_THREADS_SCRIPT = textwrap.dedent("""
    import json, logging, sys
    from pathlib import Path
    from modelhost.backends.base import InstanceSettings
    from modelhost.backends.tensorflow import TensorflowBackend
    from modelhost.config.model_config_pb2 import ModelConfig
    import numpy as np
    import tensorflow as tf

    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
    path, first, second = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    for parameters in (first, second):
        config = ModelConfig(name="m")
        config.instance_group.add(count=parameters.pop("count", 1))
        for key, value in parameters.items():
            config.parameters[key].string_value = value
        model = TensorflowBackend().load(path, config, InstanceSettings(0, 3))
        model.infer({"x": np.ones((1, 3), np.float32)}, ["y"])
    print("POOLS", json.dumps([tf.config.threading.get_intra_op_parallelism_threads(),
                               tf.config.threading.get_inter_op_parallelism_threads()]))
""")


def test_first_load_sizes_tensorflow_thread_pools_later_ones_warn(models: dict[str, Path]) -> None:
    cases = {
        # No thread parameters: intra = per-instance threads (3) x instances (2); inter stays TF's default (0).
        "default": ({"count": 2}, {}),
        # Triton's name for inter, the overrides' name (SAGEMAKER_TFS_*) for intra; the second model cannot change them.
        "explicit": ({"intra_op_thread_count": "5", "TF_NUM_INTER_THREADS": "2"}, {"TF_NUM_INTRA_THREADS": "1"}),
    }
    runs = {
        name: subprocess.Popen([sys.executable, "-c", _THREADS_SCRIPT, str(models["dense"]), *map(json.dumps, pair)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=_REPO)
        for name, pair in cases.items()
    }
    outputs = {name: run.communicate(timeout=120)[0] for name, run in runs.items()}
    pools = {name: json.loads(out.split("POOLS ")[-1]) if "POOLS " in out else out for name, out in outputs.items()}
    assert pools == {"default": [6, 0], "explicit": [5, 2]}, outputs
    assert "LOG " not in outputs["default"]
    assert "thread pools are process-wide and already sized (intra-op 5, inter-op 2" in outputs["explicit"]
