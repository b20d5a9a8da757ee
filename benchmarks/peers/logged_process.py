"""A peer server's process for the benchmarks: its output in a log file, a readiness wait, a stop that
takes every process it started with it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class LoggedProcess:
    """`command` run in `cwd` with `env`, stdout and stderr to `log`. With `own_group`, it runs in a session of
    its own and `stop` signals the whole group (a launcher and the processes it starts)."""

    def __init__(self, name: str, command: list[str], log: Path, cwd: Path, env: dict[str, str],
                 own_group: bool = False) -> None:
        self.name, self.command, self.log, self.cwd, self.env = name, command, log, cwd, env
        self.own_group = own_group
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], bool], timeout: float, poll_seconds: float = 0.2) -> None:
        """Start it and return once `ready()` holds; raise (and stop it) if it exits or `timeout` passes first."""
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                            env=self.env, start_new_session=self.own_group)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()}")
            if ready():
                return
            time.sleep(poll_seconds)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-20_000:] if self.log.exists() else ""

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM, then SIGKILL to what is left past `timeout` (the whole group with `own_group`: its id is the
        started process's pid); returns the log's tail."""
        if self.process is None:
            return self.output()
        if self.own_group:
            self._stop_group(self.process.pid, timeout)
        elif self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()
        return self.output()

    def _stop_group(self, group: int, timeout: float) -> None:
        assert self.process is not None
        if not _group_alive(group):
            return
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _group_alive(group) and time.monotonic() < deadline:
            self.process.poll()  # reap the leader, else it lingers as a zombie of the group
            time.sleep(0.1)
        if _group_alive(group):
            os.killpg(group, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
