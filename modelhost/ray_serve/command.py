"""`modelhost ray`: modelhost as a Ray Serve application, on a running Ray cluster or a local one it starts.

Takes every flag of `modelhost serve` (each replica's modelhost runs with them; --http-port and --host are
where Ray Serve's HTTP proxy listens, --model-cache-bytes is each replica's budget) and the application's
shape on Ray (replicas, autoscaling, CPUs per replica). It deploys the application as a Serve config, as
`serve deploy` would (`--print-config` prints that config instead): deploying it again with other replica
counts resizes the running application in place.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import orjson

from modelhost.ray_serve.application import REPLICA_DEPLOYMENT, RayOptions
from modelhost.ray_serve.grpc_forwarding import SERVICER_FUNCTIONS
from modelhost.serve_flags import add_serve_flags
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_sources import resolve_settings, unused_variables

log = logging.getLogger("modelhost.ray")
RAY_FIELDS = {f.name for f in fields(RayOptions)}
DRIVER_FLAGS = ("address", "app_name", "print_config")
APP_NAME = "modelhost"
IMPORT_PATH = "modelhost.ray_serve.application:app_builder"
# Variables each replica reads as the server reads them; passed in the application's runtime environment.
FORWARDED_VARIABLES = ("MODELHOST_", "SAGEMAKER_")
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0  # beyond the replicas' graceful shutdown, for Ray to remove them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelhost ray", argument_default=argparse.SUPPRESS,
        description="Serve a model repository on Ray Serve: replicas of modelhost behind Ray's HTTP proxy, each "
                    "model's requests routed to a replica that holds it (docs/scale-out.md).")
    d = RayOptions()
    ray = parser.add_argument_group("Ray Serve")
    add = ray.add_argument
    add("--address", help="the Ray cluster to run on (auto: the one this machine is part of; ray://host:10001); "
        "default: start a local one")
    add("--app-name", help=f"the Serve application's name (default {APP_NAME})")
    add("--print-config", action="store_true", help="print the Serve config (for serve deploy) and exit")
    add("--replicas", type=int, help=f"replicas of modelhost (default {d.replicas})")
    add("--min-replicas", type=int, help="with --max-replicas: autoscale between the two on ongoing requests")
    add("--max-replicas", type=int, help="autoscale up to this many replicas (default: a fixed --replicas)")
    add("--target-ongoing-requests", type=float,
        help=f"the requests in flight per replica autoscaling aims at (default {d.target_ongoing_requests:g})")
    add("--max-ongoing-requests", type=int,
        help=f"requests a replica takes at once; more wait in Ray's queues (default {d.max_ongoing_requests})")
    add("--replica-cpus", type=float, help=f"Ray CPUs each replica reserves (default {d.replica_cpus:g})")
    add("--routing", choices=("affinity", "spread"), help="affinity: each model's requests to a replica that holds "
        "it; spread: to the less busy of two random replicas, for models every replica can hold (default affinity)")
    add("--ingress-replicas", type=int, help=f"replicas of the ingress that routes requests (default "
        f"{d.ingress_replicas})")
    add_serve_flags(parser, ServerSettings(), "the built-in example repository")
    return parser


def parse_flags(flags: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[ServerSettings, RayOptions]:
    """`modelhost ray` flags -> each replica's ServerSettings (over the environment) and the RayOptions;
    a bad flag exits 2 with the usage message."""
    parser = build_parser()
    args = vars(parser.parse_args(flags))
    try:
        return settings_and_options(args, os.environ if environ is None else environ)
    except (SettingsError, TypeError) as exc:
        parser.error(str(exc))


def settings_and_options(args: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[ServerSettings, RayOptions]:
    ray_args = {name: value for name, value in args.items() if name in RAY_FIELDS}
    server_args = {name: tuple(value) if isinstance(value, list) else value for name, value in args.items()
                   if name not in RAY_FIELDS and name not in DRIVER_FLAGS}
    settings = resolve_settings(ServerSettings(), environ, server_args)
    options = RayOptions(**ray_args)
    if options.replicas < 1 or options.ingress_replicas < 1:
        raise SettingsError("--replicas and --ingress-replicas must be at least 1")
    if options.max_replicas and options.max_replicas < max(options.min_replicas, 1):
        raise SettingsError("--max-replicas must be at least --min-replicas and 1")
    if options.min_replicas and not options.max_replicas:
        raise SettingsError("--min-replicas needs --max-replicas (autoscaling between the two)")
    if settings.model_control_mode == "poll":
        raise SettingsError("--model-control-mode poll: replicas load models when a request first names them and "
                            "do not poll the repository; use none (the default) or explicit (clients may load and "
                            "unload models)")
    return settings, options


def serve_config(flags: Sequence[str], settings: ServerSettings, app_name: str = APP_NAME,
                 replicas: dict[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Serve config (ServeDeploySchema) of the application `flags` describe. `replicas`: the replica
    deployment's options that override the flags' (num_replicas, autoscaling_config), as a config file's
    `deployments` section does."""
    env = os.environ if environ is None else environ
    application: dict[str, Any] = {
        "name": app_name, "route_prefix": "/", "import_path": IMPORT_PATH, "args": {"flags": list(flags)},
        "runtime_env": {"env_vars": {k: v for k, v in env.items() if k.startswith(FORWARDED_VARIABLES)}},
    }
    if replicas:
        application["deployments"] = [{"name": REPLICA_DEPLOYMENT, **replicas}]
    config: dict[str, Any] = {"http_options": {"host": settings.host, "port": settings.http_port},
                              "applications": [application]}
    if settings.grpc_port:
        config["grpc_options"] = {"port": settings.grpc_port, "grpc_servicer_functions": list(SERVICER_FUNCTIONS)}
    return config


def deploy(config: dict[str, Any], timeout: float = START_TIMEOUT_S) -> None:
    """Deploy `config` on the connected Ray cluster (starting Serve there if needed) and wait until every
    application in it is RUNNING."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    serve.start(http_options=config["http_options"], grpc_options=config.get("grpc_options"))
    client = _get_global_client()
    assert client is not None
    client.deploy_apps(schema)
    names = {app["name"] for app in config["applications"]}
    deadline = time.monotonic() + timeout
    while True:
        statuses = {name: app.status for name, app in serve.status().applications.items() if name in names}
        if len(statuses) == len(names) and all(status == "RUNNING" for status in statuses.values()):
            return
        failed = [name for name, status in statuses.items() if status in ("DEPLOY_FAILED", "UNHEALTHY")]
        if failed:
            raise RuntimeError(f"application {failed[0]} failed to deploy: "
                               f"{serve.status().applications[failed[0]].message}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the application did not start within {timeout:g} s")
        time.sleep(0.5)


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    flags = _app_flags(argv)
    settings, _ = parse_flags(flags)
    app_name = args.get("app_name", APP_NAME)
    config = serve_config(flags, settings, app_name)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for note in unused_variables(os.environ):  # as `modelhost serve` says at its start; the replicas get them too
        log.warning("%s", note)
    if args.get("print_config"):
        sys.stdout.write(orjson.dumps(config, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    try:
        import ray
        from ray import serve
    except ImportError:
        parser.error("Ray Serve is not installed: pip install 'modelhost[ray]'")
    ray.init(address=args.get("address"), log_to_driver=False)
    deploy(config)
    log.info("modelhost on Ray Serve: HTTP on %s:%d (application %s)", settings.host, settings.http_port, app_name)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("stopping: the replicas finish what they accepted")
    # serve.delete waits for the replicas to drain; a cluster that is going away itself never answers.
    deleting = threading.Thread(target=serve.delete, args=(app_name,), daemon=True)
    deleting.start()
    deleting.join(timeout=settings.graceful_shutdown_seconds + STOP_GRACE_S)
    if deleting.is_alive():
        log.warning("the application was not deleted within %.0f s; leaving it to the cluster",
                    settings.graceful_shutdown_seconds + STOP_GRACE_S)
    ray.shutdown()
    return 0


def _app_flags(argv: Sequence[str]) -> list[str]:
    """The flags the application is built from: all but the driver's own (where to run, what to print)."""
    flags, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--address", "--app-name"):
            skip = "=" not in arg
            continue
        if name == "--print-config":
            continue
        flags.append(arg)
    return flags

