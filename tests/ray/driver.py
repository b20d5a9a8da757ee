"""The Ray tests' local cluster and Ray driver, in a process of their own.

A Ray driver runs threads of Ray's (Serve's router loop, the core worker's) inside the process that calls it;
one of them crashed a long-lived test process once (a segmentation fault in an xdist worker, which took the
rest of that worker's tests with it and left the cluster's processes behind). Here the cluster and the driver
live in a child process that leads a process group of its own: a crash fails the call that met it, and
`close` ends the child and every process it started, however it ended."""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

START_TIMEOUT = 180.0
CALL_TIMEOUT = 120.0


class RayDriver:
    """Calls, by name, the functions below in the child process; each answers or raises AssertionError."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_serve_calls, args=(child_end,), name="ray-driver")
        self._process.start()
        child_end.close()
        self._late: str | None = None  # a call whose answer never came: any later answer could be its
        self.address: str = self.call("start", timeout=START_TIMEOUT)

    def call(self, name: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        if self._late is not None:
            raise AssertionError(f"the Ray driver has not answered {self._late} yet; {name} not sent")
        self._connection.send((name, args))
        if not self._connection.poll(timeout):
            self._late = name
            raise AssertionError(f"the Ray driver did not answer {name} within {timeout:.0f} s")
        try:
            succeeded, value = self._connection.recv()
        except (EOFError, OSError):
            self._process.join(5)
            raise AssertionError(f"the Ray driver process ended during {name} "
                                 f"(exit code {self._process.exitcode})") from None
        if not succeeded:
            raise AssertionError(f"{name} failed in the Ray driver:\n{value}")
        return value

    def close(self) -> None:
        try:
            if self._process.is_alive() and self._late is None:
                self.call("stop")
        finally:
            self._process.join(30)
            try:  # whatever Ray left running in the child's group
                os.killpg(self._process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            except ProcessLookupError:
                pass


_state: dict[str, Any] = {}


def _start() -> str:
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    nodes.add_node(num_cpus=4)
    ray.init(address=nodes.address, log_to_driver=False)
    _state["nodes"] = nodes
    return str(nodes.address)


def _stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    _state.pop("nodes").shutdown()


def _replicas() -> list[dict[str, Any]]:
    """What each live replica describes of itself (one killed a moment ago may still be asked, and answer that
    it died), in replica order."""
    from ray import serve

    from modelhost.ray_serve.application import REPLICA_DEPLOYMENT
    from modelhost.ray_serve.command import APP_NAME

    handle = serve.get_deployment_handle(REPLICA_DEPLOYMENT, APP_NAME)
    answers = handle.broadcast("describe").results(timeout_s=30, return_exceptions=True)
    return sorted((a for a in answers if not isinstance(a, Exception)), key=lambda r: r["replica"])


def _on_every_replica(method: str, path: str, model: str) -> list[Any]:
    """`method path` run by every replica itself (each loads `model` first, if it may): their answers."""
    from ray import serve

    from modelhost.ray_serve.application import REPLICA_DEPLOYMENT
    from modelhost.ray_serve.command import APP_NAME
    from modelhost.ray_serve.forwarded import ForwardedRequest

    handle = serve.get_deployment_handle(REPLICA_DEPLOYMENT, APP_NAME)
    request = ForwardedRequest(method, path, b"", [], b"")
    return list(handle.broadcast("__call__", request, model).results(timeout_s=60))


def _kill_actor(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def _redeploy(argv: list[str], replicas: dict[str, Any]) -> None:
    """The same application's config with other replica options, as `serve deploy` of an edited file would."""
    from modelhost.ray_serve.command import deploy, parse_flags, serve_config

    settings, _ = parse_flags(argv)
    deploy(serve_config(argv, settings, replicas=replicas))


_CALLS: dict[str, Callable[..., Any]] = {
    "start": _start, "stop": _stop, "replicas": _replicas, "on_every_replica": _on_every_replica,
    "kill_actor": _kill_actor, "redeploy": _redeploy}


def _serve_calls(connection: Connection) -> None:
    os.setsid()
    while True:
        try:
            name, args = connection.recv()
        except EOFError:
            return
        try:
            connection.send((True, _CALLS[name](*args)))
        except Exception:
            connection.send((False, traceback.format_exc()))
        if name == "stop":
            return
