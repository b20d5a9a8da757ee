"""TorchServe archives for the tests, made by the real torch-model-archiver from handler source written here."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

# A module-level entry point, as TorchServe's custom_service.md writes one.
MODULE_HANDLE = '''
def handle(data, context):
    if data is None:  # TorchServe calls it once at load with no data
        return None
    return [{"length": len(row.get("body") or row.get("data")), "model": context.model_name,
             "batch": len(data)} for row in data]
'''

# Answers each request with what it was given and how big its batch was; a body of "raise", "count", "hang" or
# "exit" makes the handler fail in that way, "missing" raises TorchServe's PredictionException with 404; "sleep"
# takes a moment, long enough for requests to queue.
BEHAVING = '''
import os
import time

from ts.utils.util import PredictionException


def handle(data, context):
    if data is None:
        return None
    bodies = [bytes(row.get("body") or row.get("data") or b"") for row in data]
    if b"raise" in bodies:
        raise ValueError("asked to raise")
    if b"missing" in bodies:
        raise PredictionException("no such item", 404)
    if b"count" in bodies:
        return bodies[1:]
    if b"hang" in bodies:
        time.sleep(60)
    if b"exit" in bodies:
        os._exit(3)
    if b"sleep" in bodies:
        time.sleep(0.2)
    return [{"echo": body.decode(), "batch": len(data), "pid": os.getpid()} for body in bodies]
'''

# Streams its answers as TorchServe's streaming examples do (tsfs §A1.6): three intermediate responses, through the
# current and the deprecated import, then the final one. Each request's parts name its body; "fail" raises after
# the first part, "solo" is streamed alone while the rest of its batch gets the final answer only; the pause is long
# enough for a client to see that parts come before the end.
STREAMING = """
import time

from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol.otf_message_handler import send_intermediate_predict_response as deprecated_send

PAUSE_S = 0.3


def handle(data, context):
    if data is None:
        return None
    words = [bytes(row.get("body") or row.get("data") or b"").decode() for row in data]
    for index in range(len(data)):
        context.set_response_content_type(index, "text/plain")
        context.set_response_header(index, "x-batch", str(len(data)))
    if "solo" in words:
        solo = words.index("solo")
        parts = [f"solo:{step};" for step in range(3)]
        for part in parts:
            send_intermediate_predict_response({solo: part}, {solo: context.request_ids[solo]}, "ok", 200, context)
        return [f"{word}:done" for word in words]
    for step in range(3):
        send = deprecated_send if step == 2 else send_intermediate_predict_response
        send([f"{word}:{step};" for word in words], context.request_ids, "Intermediate Prediction success", 200,
             context)
        if "fail" in words:
            raise ValueError("asked to fail mid-stream")
        time.sleep(PAUSE_S)
    return [f"{word}:done" for word in words]
"""


def make_archive(directory: Path, name: str, handler: str, *, version: str = "1.0", config: str | None = None,
                 serialized: Path | None = None, model_file: str | None = None, extra: dict[str, str] | None = None,
                 archive_format: str = "default") -> Path:
    """torch-model-archiver's archive of `handler` (source text, or a built-in handler's name) in `directory`:
    `<name>.mar`, `<name>.tar.gz` or the `<name>/` directory, as `archive_format` says."""
    source = directory / f".{name}-source"
    source.mkdir(parents=True)
    if handler.isidentifier():
        handler_arg = handler
    else:
        (source / "handler.py").write_text(textwrap.dedent(handler))
        handler_arg = str(source / "handler.py")
    command = ["torch-model-archiver", "--model-name", name, "--version", version, "--handler", handler_arg,
               "--export-path", str(directory), "--archive-format", archive_format, "--force"]
    if config is not None:
        (source / "model-config.yaml").write_text(textwrap.dedent(config))
        command += ["--config-file", str(source / "model-config.yaml")]
    if serialized is not None:
        command += ["--serialized-file", str(serialized)]
    if model_file is not None:
        (source / "model.py").write_text(textwrap.dedent(model_file))
        command += ["--model-file", str(source / "model.py")]
    if extra:
        for filename, text in extra.items():
            (source / filename).write_text(text)
        command += ["--extra-files", ",".join(str(source / filename) for filename in extra)]
    subprocess.run(command, check=True, capture_output=True)
    suffix = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}[archive_format]
    return directory / f"{name}{suffix}"
