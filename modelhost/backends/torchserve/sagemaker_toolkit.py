"""A TorchServe handler that serves a SageMaker PyTorch model directory as the SageMaker PyTorch inference toolkit
serves it (tsfs §A8): the user's `code/inference.py` (or SAGEMAKER_PROGRAM) with `model_fn`, `input_fn`,
`predict_fn`, `output_fn` (any subset; the toolkit's defaults fill the rest) or `transform_fn`, each taking an
optional trailing `context`.

Loaded in a worker process by the torchserve backend (handler parameter
`modelhost.backends.torchserve.sagemaker_toolkit`): at load, `pre_model_fn`, `model_fn` (default: the directory's
TorchScript `model.pt`, or its one `*.pt`/`*.pth`) and `model_warmup_fn` run once; per batch, each request runs
through the functions on its own, with the content type and Accept of the batch's first request (Accept missing or
`*/*`: SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT, else application/json), its body a str for UTF-8 types. A function that
raises answers its request with status 500 (or the toolkit error's own), the message and its traceback.
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

DEFAULT_PROGRAM = "inference.py"
DEFAULT_ACCEPT = "application/json"
UTF8_TYPES = ("application/json", "text/csv", "text/plain", "application/jsonlines")
_FUNCTIONS = ("input_fn", "predict_fn", "output_fn")


class ToolkitError(Exception):
    """An error the toolkit answers with its own status (415 for a content type it cannot decode or encode)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Service:
    def __init__(self, context: Any) -> None:
        self.model_dir = Path(context.system_properties["model_dir"])
        self.module = _user_module(self.model_dir)
        self.functions = {name: getattr(self.module, name) for name in
                          ("pre_model_fn", "model_fn", "model_warmup_fn", "transform_fn", *_FUNCTIONS)
                          if self.module is not None and callable(getattr(self.module, name, None))}
        if "transform_fn" in self.functions and any(name in self.functions for name in _FUNCTIONS):
            raise ValueError("inference.py defines transform_fn and input_fn, predict_fn or output_fn: the toolkit "
                             "uses either transform_fn or those three")
        if "pre_model_fn" in self.functions:
            _call(self.functions["pre_model_fn"], context, str(self.model_dir))
        model_fn = self.functions.get("model_fn")
        self.model = _call(model_fn, context, str(self.model_dir)) if model_fn else _default_model(self.model_dir)
        if "model_warmup_fn" in self.functions:
            _call(self.functions["model_warmup_fn"], context, str(self.model_dir), self.model)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[Any]:
        content_type = _header(context, "Content-Type") or DEFAULT_ACCEPT
        accept = _header(context, "Accept")
        if not accept or accept == "*/*":
            accept = os.environ.get("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT") or DEFAULT_ACCEPT
        answers: list[Any] = []
        for index, row in enumerate(data):
            body = row.get("body")
            if body is None:
                body = next(iter(row.values()), b"")
            if isinstance(body, (bytes, bytearray)) and content_type.split(";")[0].strip().lower() in UTF8_TYPES:
                body = bytes(body).decode("utf-8")
            try:
                result = self._transform(body, content_type, accept, context)
            except Exception as exc:  # the toolkit answers each failed request on its own
                status = exc.status if isinstance(exc, ToolkitError) else 500
                context.set_response_status(status, type(exc).__name__, index)
                answers.append(f"{exc}\n{traceback.format_exc()}")
                continue
            if isinstance(result, tuple) and len(result) == 2:
                result, answer_type = result
            else:
                answer_type = accept
            if index == 0:
                context.set_response_content_type(0, answer_type)
            answers.append(result)
        return answers

    def _transform(self, body: Any, content_type: str, accept: str, context: Any) -> Any:
        if "transform_fn" in self.functions:
            return _call(self.functions["transform_fn"], context, self.model, body, content_type, accept)
        input_fn = self.functions.get("input_fn")
        data = _call(input_fn, context, body, content_type) if input_fn else default_input(body, content_type)
        predict_fn = self.functions.get("predict_fn")
        prediction = _call(predict_fn, context, data, self.model) if predict_fn else default_predict(data, self.model)
        output_fn = self.functions.get("output_fn")
        return _call(output_fn, context, prediction, accept) if output_fn else default_output(prediction, accept)


_service: _Service | None = None


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[Any] | None:
    """TorchServe's module-level entry point: called once with no data at load, then once per batch."""
    global _service
    if _service is None:
        _service = _Service(context)
    if data is None:
        return None
    return _service.handle(data, context)


def _user_module(model_dir: Path) -> ModuleType | None:
    program = os.environ.get("SAGEMAKER_PROGRAM") or DEFAULT_PROGRAM
    code = model_dir / "code"
    if not (code / program).is_file():
        return None
    sys.path.insert(0, str(code))
    return importlib.import_module(Path(program).stem)


def _call(function: Any, context: Any, *args: Any) -> Any:
    """`function(*args)`, or with `context` last when it takes one more argument (the toolkit's rule)."""
    try:
        count = len(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        count = len(args)
    return function(*args, context) if count == len(args) + 1 else function(*args)


def _header(context: Any, name: str) -> str | None:
    value = context.get_request_header(0, name) or context.get_request_header(0, name.lower())
    return str(value) if value else None


def _default_model(model_dir: Path) -> Any:
    """The toolkit's default model_fn: TorchScript `model.pt`, else the directory's one `*.pt` or `*.pth`."""
    import torch

    path = model_dir / "model.pt"
    if not path.is_file():
        found = sorted(p for p in model_dir.iterdir() if p.suffix in (".pt", ".pth"))
        if len(found) != 1:
            raise FileNotFoundError(f"no model_fn in inference.py, and the model directory holds "
                                    f"{len(found) or 'no'} *.pt/*.pth files where the default model_fn loads one")
        path = found[0]
    return torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]


def default_input(body: Any, content_type: str) -> Any:
    """The toolkit's default input_fn: JSON, CSV, NPY or NPZ to a tensor."""
    import torch

    media = content_type.split(";")[0].strip().lower()
    if media == "application/json":
        array = np.array(json.loads(body), dtype=np.float32)
    elif media == "text/csv":
        text = body if isinstance(body, str) else bytes(body).decode("utf-8")
        array = np.array([[float(v) for v in line.split(",")] for line in text.splitlines() if line.strip()],
                         dtype=np.float32)
    elif media == "application/x-npy":
        array = np.load(io.BytesIO(bytes(body)), allow_pickle=False)
    elif media == "application/x-npz":
        with np.load(io.BytesIO(bytes(body)), allow_pickle=False) as archive:
            array = archive[archive.files[0]]
    else:
        raise ToolkitError(415, f"Content type {content_type} is not supported by this framework.")
    return torch.from_numpy(np.ascontiguousarray(array))


def default_predict(data: Any, model: Any) -> Any:
    """The toolkit's default predict_fn: the model in eval mode on the data, without gradients."""
    import torch

    with torch.no_grad():
        model.eval()
        return model(data)


def default_output(prediction: Any, accept: str) -> Any:
    """The toolkit's default output_fn: the prediction as JSON, CSV or NPY, by Accept."""
    if hasattr(prediction, "detach"):
        prediction = prediction.detach().cpu().numpy()
    array = np.asarray(prediction)
    for media in (part.split(";")[0].strip().lower() for part in accept.split(",")):
        if media == "application/json":
            return json.dumps(array.tolist())
        if media == "text/csv":
            rows = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(1, -1)
            return "\n".join(",".join(str(v) for v in row) for row in rows.tolist()) + "\n"
        if media == "application/x-npy":
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            return buffer.getvalue()
    raise ToolkitError(415, f"Accept type {accept} is not supported by this framework.")
