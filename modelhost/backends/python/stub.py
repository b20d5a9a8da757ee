"""The worker process of an isolated Python model instance: `python -m modelhost.backends.python.stub FD`.

Started by worker_process.WorkerProcess with one end of a socket pair as FD. It serves one model instance, whatever its
spec loads (worker_code.py: a Python model's model.py, a TorchServe handler):

    server -> worker                      worker -> server
    ("init", WorkerSpec)                  ("ok", kind: None, "triton") | ("error", None, message, traceback)
    ("execute", inputs, output names[,    ("ok", outputs) | ("error", ErrorKind value, message, traceback),
     threads])                              after any number of ("partial", request index, answer)
    ("requests", [inputs], [output names], ("ok", [outputs or (ErrorKind value, message)]) | ("error", ...), after
     [streams?], [(id, parameters)])        each streamed request's ("partial", index, (response, final)),
                                            its final one included (triton_worker.py)
    ("stop",)                             ("ok", None) | ("error", None, message, traceback), then exits

Before any reply, ("metrics", changes): the changes of a Triton model's custom metrics (triton_metrics.py drain)
since the last reply, which the server applies to its own registry.

The worker exits when the server closes the socket or dies (even while execute hangs). It ignores SIGINT:
a Ctrl-C on the server's terminal reaches the whole process group, and the server stops its workers
itself, after finalize. Its stdout and stderr are the server's (inherited, unbuffered): what the model
prints shows in the server's log as it is printed.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, NoReturn

from modelhost.backends.python.channel import Channel, ChannelClosed
from modelhost.backends.python.triton_metrics import REGISTRY
from modelhost.backends.python.triton_metrics_relay import drain
from modelhost.backends.python.triton_worker import execute_requests
from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.python.worker_code import WorkerModel, WorkerSpec
from modelhost.errors import ErrorKind, ModelhostError


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_server, args=(os.getppid(),), name="exit with server", daemon=True).start()
    fd = int(argv[1])
    os.set_inheritable(fd, False)  # processes the model starts must not hold the channel open
    channel = Channel(socket.socket(fileno=fd))
    try:
        serve(channel)
    except ChannelClosed:
        pass  # the server is gone
    _exit_now()


def _exit_now() -> NoReturn:
    """Exit as a normal exit would for the model (its atexit handlers run, its output is flushed), without the
    interpreter's teardown: with torch or TensorFlow loaded that takes half a second of CPU, which the server's
    unload (a scale-down, a reload, a stop) would wait for. Threads the model left running die with the process, as
    the server's kill after STOP_GRACE_S would end them."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _exit_with_server(server: int) -> None:
    # A server killed outright (SIGKILL) cannot stop its workers: one that waits on the channel sees it
    # close, but one busy in a hung execute would live on. Once a second is cheap and fast enough.
    while os.getppid() == server:
        time.sleep(1.0)
    os._exit(1)


def serve(channel: Channel) -> None:
    """Load the model the first message names, then answer messages until "stop"."""
    kind, spec = channel.receive()
    assert kind == "init", f"first message must be init, got {kind!r}"
    try:
        model = spec.load()
    except UserCodeError as exc:
        channel.send(("error", None, exc.message, exc.details))
        return
    channel.send(("ok", getattr(model, "kind", None)))
    send_partials_to = getattr(model, "send_partials_to", None)
    if send_partials_to is not None:  # a model that answers a request in parts, before its batch's reply
        send_partials_to(lambda index, answer: channel.send(("partial", index, answer)))
    while True:
        message = channel.receive()
        if message[0] == "execute":
            if len(message) > 3 and message[3]:
                _use_threads(model, message[3])
            _reply(channel, spec, _execute(model, message[1], message[2]))
        elif message[0] == "requests":  # a Triton Python model's batch, request by request (triton_worker.py)
            _reply(channel, spec, execute_requests(model, channel, *message[1:]))
        elif message[0] == "stop":
            _reply(channel, spec, _finalize(model))
            return
        else:
            raise ValueError(f"unknown message {message[0]!r}")


def _use_threads(model: WorkerModel, threads: int) -> None:
    """The CPU threads the server lends this batch (its instance's share, and cores idle now), for a model that
    can change its framework's thread count."""
    set_threads = getattr(model, "set_threads", None)
    if set_threads is not None:
        set_threads(threads)


def _execute(model: WorkerModel, inputs: dict[str, Any], outputs: list[str]) -> tuple[Any, ...]:
    try:
        return "ok", model.execute(inputs, outputs)
    except ModelhostError as exc:
        return "error", exc.kind.value, exc.message, getattr(exc, "details", "")


def _finalize(model: WorkerModel) -> tuple[Any, ...]:
    try:
        model.finalize()
    except UserCodeError as exc:
        return "error", None, exc.message, exc.details
    return "ok", None


def _reply(channel: Channel, spec: WorkerSpec, reply: tuple[Any, ...]) -> None:
    if REGISTRY.families:  # a Triton model's custom metrics changed here reach the server before the reply
        changes = drain()
        if changes:
            channel.send(("metrics", changes))
    try:
        channel.send(reply)
    except (ChannelClosed, OSError):
        raise
    except Exception as exc:  # outputs that do not pickle (object arrays of odd objects)
        message = f"{spec.label}: its outputs cannot be sent to the server: {type(exc).__name__}: {exc}"
        channel.send(("error", ErrorKind.INTERNAL.value, message, ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
