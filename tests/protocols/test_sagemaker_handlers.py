"""inference.py conventions (protocols §6.5): TF Serving handlers, inference-toolkit functions, loading and errors.

Every test writes a real `code/inference.py` (and siblings) under tmp_path and imports it through load_handler;
Defaults is a small real JSON/CSV implementation whose served model doubles its input.
"""

from __future__ import annotations

import io
import json
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.sagemaker.handler_api import Handler, HandlerError, RequestInfo, TfsResponse
from modelhost.protocols.sagemaker.handlers import install_requirements, load_handler
from modelhost.protocols.sagemaker.tfs_handler import Context

JSON = "application/json"
CSV = "text/csv"
REST_URI = "http://127.0.0.1:8080/v1/models/m/versions/1:predict"


class JsonDefaults:
    """modelhost's defaults in miniature: JSON/CSV -> array, model(data), array -> JSON, TFS predict doubling rows."""

    def decode(self, body: bytes, content_type: str) -> Any:
        if content_type == JSON:
            return np.asarray(json.loads(body), dtype=np.float64)
        if content_type == CSV:
            return np.atleast_1d(np.genfromtxt(io.BytesIO(body), delimiter=","))
        raise ModelhostError(ErrorKind.UNSUPPORTED, f"content type {content_type!r} is not supported")

    def predict(self, data: Any, model: Any) -> Any:
        return model(data)

    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]:
        if accept != JSON:
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"accept {accept!r} is not supported")
        return json.dumps(np.asarray(prediction).tolist()).encode(), JSON

    def tfs_predict(self, body: bytes) -> TfsResponse:
        try:
            instances = np.asarray(json.loads(body)["instances"], dtype=np.float64)
        except (ValueError, KeyError, TypeError) as exc:
            return TfsResponse(400, json.dumps({"error": f"bad predict body: {exc}"}).encode())
        return TfsResponse(200, json.dumps({"predictions": (instances * 2).tolist()}).encode())


def double(data: Any) -> Any:
    """The served model (what predict_fn gets without a model_fn)."""
    return np.asarray(data) * 2


@pytest.fixture(autouse=True)
def _restore_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test's sys.path edits and user modules end with the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        location = getattr(sys.modules[name], "__file__", None) or ""
        if name.startswith("_modelhost_user_") or location.startswith(str(tmp_path)):
            del sys.modules[name]


def write_code(root: Path, source: str, name: str = "inference.py", files: dict[str, str] | None = None) -> Path:
    """root/model/code/<name> holding `source`, plus `files` by path relative to the code dir."""
    code = root / "model" / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / name).write_text(textwrap.dedent(source))
    for relative, text in (files or {}).items():
        path = code / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return code


def load(code: Path, **kwargs: Any) -> Handler:
    handler = load_handler(code, **kwargs)
    assert handler is not None
    handler.load_model(code.parent, double, model_name="m", model_version="1")
    return handler


def request(body: bytes | str, content_type: str = JSON, accept: str = JSON, **fields: str) -> RequestInfo:
    data = body.encode() if isinstance(body, str) else body
    values = {"model_name": "m", "model_version": "1", "rest_uri": REST_URI, **fields}
    return RequestInfo(body=data, content_type=content_type, accept=accept, **values)


def invoke(handler: Handler, body: bytes | str, content_type: str = JSON, accept: str = JSON, **fields: str) -> Any:
    """The handler's answer as (parsed JSON or raw bytes, content type)."""
    payload, answer_type = handler.invoke(request(body, content_type, accept, **fields), JsonDefaults())
    assert isinstance(payload, bytes)
    return (json.loads(payload) if answer_type == JSON else payload), answer_type


def load_error(code: Path) -> str:
    with pytest.raises(ModelhostError) as caught:
        load(code)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    return caught.value.message


# --- finding the module -------------------------------------------------------------------------------------------


def test_no_code_dir_or_no_module_means_no_handler(tmp_path: Path) -> None:
    assert load_handler(None) is None
    assert load_handler(tmp_path) is None
    code = write_code(tmp_path, "def handler(data, context):\n    return b'', 'text/plain'\n", name="serve.py")
    assert load_handler(code) is None  # the default program is inference.py


@pytest.mark.parametrize("program", ["serve.py", "serve"])
def test_program_names_the_module(tmp_path: Path, program: str) -> None:
    code = write_code(tmp_path, "def handler(data, context):\n    return b'served', 'text/plain'\n", name="serve.py")
    assert invoke(load(code, program=program), b"") == (b"served", "text/plain")


@pytest.mark.parametrize("program", ["../inference.py", "/etc/inference.py", ""])
def test_program_outside_the_code_dir_is_refused(tmp_path: Path, program: str) -> None:
    with pytest.raises(ModelhostError, match="SAGEMAKER_PROGRAM"):
        load_handler(tmp_path, program=program)


# --- TF Serving container convention ------------------------------------------------------------------------------


def test_tfs_handler_reads_the_body_stream(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import json

        def handler(data, context):
            values = json.loads(data.read().decode("utf-8"))
            return json.dumps({"sum": sum(values)}), "application/json"
    """)
    handler = load(code)
    assert handler.convention == "tfs"
    assert invoke(handler, "[1, 2, 3.5]") == ({"sum": 6.5}, JSON)


def test_tfs_context_has_the_container_fields(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import json

        def handler(data, context):
            return json.dumps({"fields": list(context._fields), "values": list(context)}), "application/json"
    """)
    handler = load(code)
    attributes = "tfs-model-name=m,tfs-method=classify , trace=1"
    document, _ = invoke(handler, "{}", CSV, "text/plain", custom_attributes=attributes)
    assert document["fields"] == [
        "model_name", "model_version", "method", "rest_uri", "grpc_port", "channel",
        "custom_attributes", "request_content_type", "accept_header", "content_length",
    ]
    assert list(Context._fields) == document["fields"]
    assert document["values"] == [
        "m", "1", "classify", REST_URI, None, None, attributes, CSV, "text/plain", 2,
    ]
    document, _ = invoke(handler, "", "", "", model_version="")
    assert document["values"] == ["m", None, "predict", REST_URI, None, None, None, JSON, JSON, 0]


def test_tfs_input_and_output_handlers_go_through_tfs_predict(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import json

        def input_handler(data, context):
            rows = [[float(v) for v in line.split(",")] for line in data.read().decode().splitlines()]
            return json.dumps({"instances": rows})

        def output_handler(response, context):
            seen = {
                "status": response.status_code, "ok": response.ok, "url": response.url, "reason": response.reason,
                "type": response.headers["content-type"], "text_is_json": json.loads(response.text) == response.json(),
                "length": int(response.headers.get("Content-Length")) == len(response.content),
            }
            return json.dumps({"seen": seen, **response.json()}).encode(), context.accept_header
    """)
    document, content_type = invoke(load(code), "1,2\n3,4", CSV)
    assert content_type == JSON
    assert document["predictions"] == [[2.0, 4.0], [6.0, 8.0]]
    assert document["seen"] == {"status": 200, "ok": True, "url": REST_URI, "reason": "OK", "type": JSON,
                                "text_is_json": True, "length": True}


def test_output_handler_sees_tfs_errors_and_decides(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        def input_handler(data, context):
            return data.read()

        def output_handler(response, context):
            if context.custom_attributes == "strict":
                response.raise_for_status()
            return f"{response.status_code} {response.ok} {response.json()['error'][:16]}", "text/plain"
    """)
    handler = load(code)
    assert invoke(handler, '{"rows": []}') == (b"400 False bad predict body", "text/plain")
    with pytest.raises(HandlerError) as caught:
        invoke(handler, '{"rows": []}', custom_attributes="strict")
    assert caught.value.status == 400
    assert caught.value.message.startswith(f"output_handler failed: 400 Client Error: Bad Request for url: {REST_URI}")


def test_tfs_handler_wins_over_the_pair(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        def handler(data, context):
            return b"handler", "text/plain"

        def input_handler(data, context):
            raise AssertionError("not called")

        def output_handler(response, context):
            raise AssertionError("not called")
    """)
    assert invoke(load(code), b"") == (b"handler", "text/plain")


@pytest.mark.parametrize("defined", ["input_handler", "output_handler"])
def test_half_a_tfs_pair_is_a_load_error(tmp_path: Path, defined: str) -> None:
    code = write_code(tmp_path, f"def {defined}(data, context):\n    return data\n")
    assert "without" in load_error(code)


# --- inference toolkit convention ---------------------------------------------------------------------------------


def test_model_fn_only_runs_once_and_defaults_do_the_rest(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import os

        import numpy as np

        loads = []

        def model_fn(model_dir):
            loads.append(model_dir)
            with open(os.path.join(model_dir, "factor.txt")) as f:
                factor = float(f.read())
            return lambda data: np.asarray(data) * factor
    """)
    (code.parent / "factor.txt").write_text("3")
    handler = load(code)
    assert handler.convention == "toolkit"
    assert invoke(handler, "[1, 2]") == ([3.0, 6.0], JSON)
    assert invoke(handler, "5,6", CSV) == ([15.0, 18.0], JSON)
    assert handler.module.loads == [str(code.parent)]


def test_input_fn_and_output_fn_around_the_served_model(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import json

        import numpy as np

        def input_fn(input_data, content_type):
            if content_type == "application/octet-stream":
                assert isinstance(input_data, bytes)
                return np.frombuffer(input_data, dtype=np.uint8)
            assert isinstance(input_data, str), type(input_data)
            if content_type == "text/csv":
                return np.array([float(v) for v in input_data.split(",")])
            return np.array(json.loads(input_data)["values"])

        def output_fn(prediction, accept):
            if accept.startswith("text/plain"):
                return " ".join(str(int(v)) for v in prediction)
            return json.dumps(prediction.tolist()).encode(), "application/json"
    """)
    handler = load(code)
    assert invoke(handler, '{"values": [1, 2]}') == ([2, 4], JSON)
    assert invoke(handler, "1,2,3", CSV, "text/plain, application/json") == (b"2 4 6", "text/plain")
    assert invoke(handler, bytes([1, 5]), "application/octet-stream", "text/plain") == (b"2 10", "text/plain")


def test_functions_with_a_context_argument_see_model_and_request(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        from __future__ import annotations

        from dataclasses import dataclass


        @dataclass
        class Model:
            seen_at_load: dict


        def model_fn(model_dir, context):
            return Model({"dir": model_dir, "props": context.system_properties, "name": context.model_name,
                          "request_type": context.request_content_type})

        def predict_fn(data, model, context=None):
            return {
                "load": model.seen_at_load, "data": data.tolist(), "name": context.model_name,
                "version": context.model_version, "dir": context.model_dir, "type": context.request_content_type,
                "accept": context.accept_header, "attributes": context.custom_attributes,
            }

        def output_fn(prediction, accept, context):
            import json
            return json.dumps(prediction), accept
    """)
    document, _ = invoke(load(code), "[1]", custom_attributes="a=b")
    model_dir = str(code.parent)
    assert document == {
        "load": {"dir": model_dir, "props": {"model_dir": model_dir, "gpu_id": None}, "name": "m",
                 "request_type": None},
        "data": [1.0], "name": "m", "version": "1", "dir": model_dir, "type": JSON, "accept": JSON,
        "attributes": "a=b",
    }


def test_each_concurrent_request_gets_its_own_context(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import time

        def transform_fn(model, input_data, content_type, accept, context):
            time.sleep(0.001)
            return context.custom_attributes + "|" + input_data, "text/plain"
    """)
    handler = load(code)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: invoke(handler, f"[{i}]", custom_attributes=f"id={i}")[0], range(64)))
    assert answers == [f"id={i}|[{i}]".encode() for i in range(64)]


def test_transform_fn_gets_the_served_model(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        import json

        def transform_fn(model, input_data, content_type, accept):
            return json.dumps({"out": model(json.loads(input_data)).tolist(), "type": content_type, "accept": accept})
    """)
    assert invoke(load(code), "[2, 3]", accept="application/json, text/csv") == (
        {"out": [4, 6], "type": JSON, "accept": "application/json, text/csv"}, JSON)


def test_pre_model_and_warmup_hooks_run_around_model_fn(tmp_path: Path) -> None:
    code = write_code(tmp_path, """
        calls = []

        def pre_model_fn(model_dir):
            calls.append("pre")

        def model_fn(model_dir):
            calls.append("model")
            return abs

        def model_warmup_fn(model_dir, model):
            calls.append(f"warmup {model(-1)}")
    """)
    assert load(code).module.calls == ["pre", "model", "warmup 1"]


def test_invoke_before_load_model_is_unavailable(tmp_path: Path) -> None:
    handler = load_handler(write_code(tmp_path, "def predict_fn(data, model):\n    return data\n"))
    assert handler is not None
    with pytest.raises(ModelhostError) as caught:
        handler.invoke(request("[1]"), JsonDefaults())
    assert caught.value.kind is ErrorKind.UNAVAILABLE


def test_errors_from_the_defaults_pass_through(tmp_path: Path) -> None:
    handler = load(write_code(tmp_path, "def predict_fn(data, model):\n    return data\n"))
    with pytest.raises(ModelhostError) as caught:
        invoke(handler, b"\x00", "application/x-unknown")
    assert caught.value.kind is ErrorKind.UNSUPPORTED


# --- loading: isolation, siblings, requirements ---------------------------------------------------------------------


def test_two_models_with_the_same_module_and_sibling_names_stay_apart(tmp_path: Path) -> None:
    source = """
        from helpers import LABEL

        def handler(data, context):
            return LABEL, "text/plain"
    """
    first = write_code(tmp_path / "a", source, files={"lib/helpers.py": "LABEL = 'from lib of a'\n"})
    second = write_code(tmp_path / "b", source, files={"helpers.py": "LABEL = 'from code of b'\n"})
    handler_a, handler_b = load(first, module_tag="a"), load(second, module_tag="b")
    assert invoke(handler_a, b"") == (b"from lib of a", "text/plain")
    assert invoke(handler_b, b"") == (b"from code of b", "text/plain")
    assert handler_a.module.__name__ != handler_b.module.__name__
    assert sys.modules[handler_a.module.__name__] is handler_a.module
    handler_a.close()
    assert handler_a.module.__name__ not in sys.modules
    assert sys.modules[handler_b.module.__name__] is handler_b.module


def test_reloading_a_model_imports_its_changed_siblings(tmp_path: Path) -> None:
    source = "import helpers\n\ndef handler(data, context):\n    return helpers.LABEL, 'text/plain'\n"
    code = write_code(tmp_path, source, files={"helpers.py": "LABEL = 'first'\n"})
    first = load(code, module_tag="m")
    first.close()
    (code / "helpers.py").write_text("LABEL = 'second version'\n")
    assert invoke(load(code, module_tag="m"), b"") == (b"second version", "text/plain")
    assert invoke(first, b"") == (b"first", "text/plain")  # a closed handler's module kept what it imported


def write_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel of package modelhost_tiny_dep: pip installs it with no build tools."""
    files = {
        "modelhost_tiny_dep/__init__.py": "ANSWER = 'tiny dep 1.0'\n",
        "modelhost_tiny_dep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: modelhost-tiny-dep\nVersion: 1.0\n",
        "modelhost_tiny_dep-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "modelhost_tiny_dep-1.0.dist-info/RECORD,,\n"
    files["modelhost_tiny_dep-1.0.dist-info/RECORD"] = record
    directory.mkdir(parents=True)
    wheel = directory / "modelhost_tiny_dep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def test_requirements_install_a_local_package(tmp_path: Path) -> None:
    project = write_wheel(tmp_path / "wheels")
    code = write_code(tmp_path, """
        import modelhost_tiny_dep

        def handler(data, context):
            return modelhost_tiny_dep.ANSWER, "text/plain"
    """, files={"requirements.txt": f"{project}\n"})
    target = tmp_path / "site"
    install_requirements(code, target, pip_args=("--no-index",))
    assert (target / "modelhost_tiny_dep" / "__init__.py").is_file()
    handler = load(code)
    assert invoke(handler, b"") == (b"tiny dep 1.0", "text/plain")
    assert Path(sys.modules["modelhost_tiny_dep"].__file__ or "").is_relative_to(target)


def test_failed_requirements_name_the_file_and_quote_pip(tmp_path: Path) -> None:
    code = write_code(tmp_path, "def handler(data, context):\n    return b'', 'x'\n",
                      files={"requirements.txt": "modelhost-no-such-package-anywhere==9.9\n"})
    with pytest.raises(ModelhostError) as caught:
        install_requirements(code, tmp_path / "site", pip_args=("--no-index",))
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert str(code / "requirements.txt") in caught.value.message
    assert "No matching distribution found for modelhost-no-such-package-anywhere" in caught.value.message


def test_no_requirements_file_installs_nothing(tmp_path: Path) -> None:
    code = write_code(tmp_path, "def handler(data, context):\n    return b'', 'x'\n")
    install_requirements(code, tmp_path / "site")
    assert not (tmp_path / "site").exists()


# --- load-time errors ---------------------------------------------------------------------------------------------

LOAD_ERRORS = [
    pytest.param("def handler(data, context)\n    return 1\n", "SyntaxError", id="syntax-error"),
    pytest.param("import modelhost_module_that_is_not_there\n", "ModuleNotFoundError", id="import-error"),
    pytest.param("raise SystemExit(2)\n", "SystemExit", id="exit-at-import"),
    pytest.param("def transform_fn(model, data, content_type, accept):\n    pass\n"
                 "def input_fn(data, content_type):\n    pass\n",
                 "transform_fn cannot be used together with input_fn", id="transform-fn-mixed"),
    pytest.param("def model_fn(model_dir):\n    raise OSError('weights.bin is missing')\n",
                 "model_fn failed: weights.bin is missing", id="model-fn-raises"),
    pytest.param("def handler(data, context):\n    pass\ndef model_fn(model_dir):\n    pass\n",
                 "use one convention", id="both-conventions"),
    pytest.param("def handle(data, context):\n    pass\n", "defines none of", id="no-known-function"),
    pytest.param("predict_fn = 'not a function'\n", "predict_fn must be a function, got str", id="not-callable"),
    pytest.param("def predict_fn(data):\n    pass\n",
                 "predict_fn(data) cannot be called as predict_fn(data, model[, context])", id="predict-fn-arity"),
    pytest.param("def handler(data):\n    pass\n", "handler(data) cannot be called as handler(data, context)",
                 id="handler-arity"),
]


@pytest.mark.parametrize(("source", "expected"), LOAD_ERRORS)
def test_load_errors_are_unavailable_with_the_reason(tmp_path: Path, source: str, expected: str) -> None:
    before = set(sys.modules)
    code = write_code(tmp_path, source)
    message = load_error(code)
    assert expected in message
    assert str(code) in message
    if "model_fn" not in source:  # a failed import or convention check leaves no module behind
        assert not [name for name in set(sys.modules) - before if name.startswith("_modelhost_user_")]


# --- request-time errors ------------------------------------------------------------------------------------------

EXCEPTIONS = """
class Coded(Exception):  # the toolkit's GenericInferenceToolkitError shape
    def __init__(self, status_code, message):
        super().__init__(status_code, message)
        self.status_code = status_code
        self.message = message

class Statused(Exception):
    status = 404

class UnsupportedFormatError(Exception):
    pass
"""

USER_EXCEPTIONS = [
    pytest.param("ValueError('boom')", 500, "boom", id="plain"),
    pytest.param("Coded(422, 'too many rows')", 422, "too many rows", id="status_code"),
    pytest.param("Statused('no such row')", 404, "no such row", id="status"),
    pytest.param("Coded(200, 'odd')", 500, "odd", id="status-out-of-range"),
    pytest.param("UnsupportedFormatError('text/x')", 415, "text/x", id="unsupported-format"),
    pytest.param("KeyError()", 500, "KeyError", id="empty-message"),
    pytest.param("SystemExit(3)", 500, "3", id="system-exit"),
]

FAILING_FUNCTIONS = {
    "handler": "def handler(data, context):\n    raise {}\n",
    "input_handler": "def input_handler(data, context):\n    raise {}\n"
                     "def output_handler(response, context):\n    return b'', 'x'\n",
    "output_handler": "def input_handler(data, context):\n    return data.read()\n"
                      "def output_handler(response, context):\n    raise {}\n",
    "input_fn": "def input_fn(input_data, content_type):\n    raise {}\n",
    "predict_fn": "def predict_fn(data, model, context):\n    raise {}\n",
    "output_fn": "def output_fn(prediction, accept):\n    raise {}\n",
    "transform_fn": "def transform_fn(model, input_data, content_type, accept):\n    raise {}\n",
}


@pytest.mark.parametrize(("raised", "status", "text"), USER_EXCEPTIONS)
@pytest.mark.parametrize("function", list(FAILING_FUNCTIONS))
def test_user_exceptions_become_handler_errors(
    tmp_path: Path, function: str, raised: str, status: int, text: str
) -> None:
    handler = load(write_code(tmp_path, EXCEPTIONS + FAILING_FUNCTIONS[function].format(raised)))
    with pytest.raises(HandlerError) as caught:
        invoke(handler, '[1]')
    assert (caught.value.status, caught.value.message) == (status, f"{function} failed: {text}")


WRONG_RETURNS = [
    pytest.param("def handler(data, context):\n    return b'body'\n", "handler returned a bytes", id="handler-bytes"),
    pytest.param("def handler(data, context):\n    return b'body', None\n",
                 "handler returned a tuple of (bytes, NoneType)", id="handler-no-type"),
    pytest.param("def handler(data, context):\n    return {'a': 1}, 'application/json'\n",
                 "handler returned a tuple of (dict, str)", id="handler-dict-body"),
    pytest.param("def input_handler(data, context):\n    return {'instances': [1]}\n"
                 "def output_handler(response, context):\n    return b'', 'x'\n",
                 "input_handler returned a dict; expected a str or bytes", id="input-handler-dict"),
    pytest.param("def input_handler(data, context):\n    return data.read()\n"
                 "def output_handler(response, context):\n    return response\n",
                 "output_handler returned a TfsResponse", id="output-handler-response"),
    pytest.param("def output_fn(prediction, accept):\n    return prediction\n",
                 "output_fn returned a ndarray", id="output-fn-array"),
    pytest.param("def transform_fn(model, data, content_type, accept):\n    return [b'x', 'text/plain']\n",
                 "transform_fn returned a list of (bytes, str)", id="transform-fn-list"),
    pytest.param("def transform_fn(model, data, content_type, accept):\n    return b'x', 'a', 'b'\n",
                 "transform_fn returned a tuple of (bytes, str, str)", id="transform-fn-triple"),
]


@pytest.mark.parametrize(("source", "expected"), WRONG_RETURNS)
def test_wrong_return_types_are_500_saying_what_came_back(tmp_path: Path, source: str, expected: str) -> None:
    handler = load(write_code(tmp_path, source))
    with pytest.raises(HandlerError) as caught:
        invoke(handler, '[1]')
    assert caught.value.status == 500
    assert expected in caught.value.message


def test_non_utf8_text_for_input_fn_is_400(tmp_path: Path) -> None:
    handler = load(write_code(tmp_path, "def input_fn(input_data, content_type):\n    return input_data\n"))
    with pytest.raises(HandlerError) as caught:
        invoke(handler, b"\xff\xfe", CSV)
    assert caught.value.status == 400
    assert "not UTF-8" in caught.value.message
