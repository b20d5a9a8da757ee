"""One worker process of an isolated Python model instance (backends/python/stub.py) and the channel to it:
started with subprocess (never fork: the server has threads and an event loop), called synchronously or from the
event loop, measured (RSS), stopped or killed. isolated.py restarts it when it fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import modelhost
from modelhost.backends.python.channel import Channel, ChannelClosed
from modelhost.backends.python.triton_metrics_relay import WorkerMetrics
from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.python.worker_code import WorkerSpec
from modelhost.core import compute_threads

log = logging.getLogger("modelhost.backends.python.backend")

Partial = Callable[[int, Any], None]  # (index of the request in the batch, an answer to it sent before the reply)
STOP_GRACE_S = 5.0  # after finalize (or a restart's stop request), how long a worker may take to exit
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class IsolationOptions:
    """config.pbtxt parameters of an isolated model (docs/backends/python.md); 0 = no limit."""

    execute_timeout_s: float = 30.0
    initialize_timeout_s: float = 300.0
    max_rss_bytes: int = 0


class WorkerProcess:
    """One started worker and the channel to it. Raises UserCodeError when it cannot load its model."""

    def __init__(self, spec: WorkerSpec, options: IsolationOptions) -> None:
        self._spec = spec
        self.metrics = WorkerMetrics()  # its Triton model's custom metrics, in the server's registry while it lives
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "modelhost.backends.python.stub", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=_worker_environment(spec),
                )
            except OSError as exc:
                ours.close()
                raise UserCodeError(f"{spec.path}: cannot start a worker process: {exc}") from exc
        compute_threads.lower_process(self.process.pid)  # it computes; a loading thread's mark is no priority for it
        self.channel = Channel(ours)
        try:
            reply = self.call(("init", spec), options.initialize_timeout_s)
        except TimeoutError:
            self.kill()
            raise UserCodeError(f"{spec.path}: initialize did not finish within "
                                f"{options.initialize_timeout_s:g} s (initialize_timeout_seconds)") from None
        except ChannelClosed:
            reason = self.exit_reason()
            self.kill()
            raise UserCodeError(f"{spec.path}: the worker process {reason} while loading it") from None
        if reply[0] != "ok":
            self.kill()
            raise UserCodeError(reply[2], reply[3])
        self.kind: str | None = reply[1]  # what the worker loaded: "triton" for a TritonPythonModel

    @property
    def pid(self) -> int:
        return self.process.pid

    def call(self, message: tuple[Any, ...], timeout_s: float, partial: Partial | None = None,
             on_call: Callable[[Any], Any] | None = None) -> tuple[Any, ...]:
        """Send one message and wait for its reply; raises TimeoutError or ChannelClosed. The worker's partial
        answers before the reply go to `partial(index, answer)` (dropped when None); its own calls to the server
        before the reply (("call", what): a Triton model's BLS) are answered with ("answer", on_call(what))."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        self.channel.send(message, deadline)
        while True:
            reply: tuple[Any, ...] = self.channel.receive(deadline)
            if reply[0] == "call" and on_call is not None:
                self.channel.send(("answer", on_call(reply[1])), deadline)
                continue
            if reply[0] == "metrics":
                self.metrics.apply(reply[1])
                continue
            if reply[0] != "partial":
                return reply
            if partial is not None:
                partial(reply[1], reply[2])

    async def call_async(self, message: tuple[Any, ...], timeout_s: float,
                         partial: Partial | None = None) -> tuple[Any, ...]:
        """`call` on the running event loop; raises TimeoutError or ChannelClosed (the channel is then unusable:
        the caller kills the worker)."""
        # A timer that cancels this task, rather than asyncio.wait_for's task per call (the scheduler runs the call
        # as a task of its own, shielded from the request's cancellation).
        task = asyncio.current_task()
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            if task is not None:
                task.cancel()

        timer = asyncio.get_running_loop().call_later(timeout_s, expire) if timeout_s else None
        try:
            await self.channel.send_async(message)
            while True:
                reply: tuple[Any, ...] = await self.channel.receive_async()
                if reply[0] == "metrics":
                    self.metrics.apply(reply[1])
                    continue
                if reply[0] != "partial":
                    return reply
                if partial is not None:
                    partial(reply[1], reply[2])
        except asyncio.CancelledError:
            if not expired:
                raise
            raise TimeoutError from None
        finally:
            if timer is not None:
                timer.cancel()

    def rss_bytes(self) -> int:
        """Resident memory of the worker now, from /proc/<pid>/statm; 0 where that cannot be read."""
        try:
            with open(f"/proc/{self.pid}/statm", "rb") as statm:
                return int(statm.read().split()[1]) * _PAGE_SIZE
        except (OSError, IndexError, ValueError):
            return 0

    def exit_reason(self) -> str:
        """How the worker ended ("exited with code 3", "was killed by signal 11 (SIGSEGV)"), waiting briefly."""
        try:
            code = self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return "closed its channel but did not exit, so it was killed"
        return _describe_exit(code)

    def stop(self, timeout_s: float) -> None:
        """Ask the worker to run finalize and exit; kill it when it does not. Logs a finalize that raised."""
        try:
            reply = self.call(("stop",), timeout_s)
            if reply[0] != "ok":
                log.warning("%s\n%s", reply[2], reply[3])
            self.process.wait(timeout=STOP_GRACE_S)
        except (TimeoutError, ChannelClosed, subprocess.TimeoutExpired):
            log.warning("%s: its worker process (pid %d) did not stop in time after finalize; killing it",
                        self._spec.label, self.pid)
        self.kill()

    def kill(self) -> None:
        """Kill the worker (if it still runs), reap it and close the channel."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.channel.close()
        self.metrics.close()


def timed_out(timeout: float) -> str:
    return f"did not answer within {timeout:g} s (execute_timeout_seconds), so it was killed"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _worker_environment(spec: WorkerSpec) -> dict[str, str]:
    # The worker imports modelhost from wherever this server does, whatever its working directory or
    # sys.path; unbuffered output so that what a model prints is in the log before a crash.
    root = str(Path(modelhost.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **spec.environment(),
            "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root, "PYTHONUNBUFFERED": "1"}
