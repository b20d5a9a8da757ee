"""modelhost as a Ray Serve application: an ingress deployment in front of modelhost replicas.

`app_builder` is Ray Serve's application builder, the `import_path` of the config `modelhost ray` deploys (and
of `serve deploy` / `serve run` config files: `modelhost ray --print-config`); its `args` hold `flags`, a list of
`modelhost ray` flags, which build the application as `build_application(settings, options)`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from modelhost.ray_serve.affinity_router import ROUTING_STATS_PERIOD_S
from modelhost.ray_serve.grpc_forwarding import IngressRpcs
from modelhost.ray_serve.ingress import Ingress
from modelhost.ray_serve.replica import ModelhostReplica
from modelhost.settings import ServerSettings
from modelhost.store.archive_store import holds_only_archives

REPLICA_DEPLOYMENT = "ModelhostReplica"
# Ray imports the router by its path where the routers run (the ingress' process).
ROUTER_CLASS = "modelhost.ray_serve.affinity_router.ModelAffinityRouter"
INGRESS_DEPLOYMENT = "ModelhostIngress"


@dataclass(frozen=True, slots=True)
class RayOptions:
    """The application's shape on Ray. `max_replicas` above `min_replicas` turns on Ray Serve's autoscaling on
    ongoing requests per replica (`target_ongoing_requests`); otherwise `replicas` run. `routing`: `affinity`
    (each model's requests to a replica holding it) or `spread` (the less busy of two random replicas, whatever
    the model: for models that every replica can hold)."""

    replicas: int = 1
    min_replicas: int = 0
    max_replicas: int = 0
    target_ongoing_requests: float = 2.0
    max_ongoing_requests: int = 64
    replica_cpus: float = 1.0
    ingress_replicas: int = 1
    routing: str = "affinity"

    def scaling(self) -> dict[str, Any]:
        if self.max_replicas > max(self.min_replicas, 0) and self.max_replicas > 1:
            return {"autoscaling_config": {
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": max(self.min_replicas, 1),
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": 2.0, "downscale_delay_s": 10.0}}
        return {"num_replicas": self.replicas}


def replica_settings(settings: ServerSettings) -> ServerSettings:
    """What each replica's modelhost runs with: no ports of its own (Ray's proxy has them), every model loaded
    when a request first names it (and the --load-model ones at its start), within --model-cache-bytes (per
    replica); whether clients may load and unload is the operator's --model-control-mode, apart. A repository of
    archives is a multi-model endpoint's, as SageMaker's; any other directory a model repository in any layout."""
    location = settings.model_repository or ""
    archives = location.startswith("s3://") or (bool(location) and holds_only_archives(Path(location)))
    return replace(settings, multi_model=archives, models_on_demand=not archives, model_control_mode="explicit",
                   grpc_port=0, metrics_port=0, workers=1, host="127.0.0.1",
                   sagemaker_port=settings.sagemaker_port or 8080)


def build_application(settings: ServerSettings, options: RayOptions) -> Any:
    from ray import serve

    client_control = settings.model_control_mode == "explicit"
    settings = replica_settings(settings)
    replica = serve.deployment(
        name=REPLICA_DEPLOYMENT, max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options={"num_cpus": options.replica_cpus},
        graceful_shutdown_timeout_s=settings.graceful_shutdown_seconds, graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=2.0, request_router_config={
            "request_router_class": ROUTER_CLASS, "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S},
        **options.scaling())(ModelhostReplica)
    ingress = serve.deployment(
        name=INGRESS_DEPLOYMENT, num_replicas=options.ingress_replicas,
        max_ongoing_requests=max(1000, options.max_ongoing_requests * 16), ray_actor_options={"num_cpus": 0},
    )(serve.ingress()(IngressDeployment))
    return ingress.bind(replica.bind(settings, client_control), settings.http_max_body_bytes,
                        options.routing == "affinity")


class IngressDeployment(IngressRpcs):
    """HTTP through Ray's HTTP proxy (the ASGI app), and V2 gRPC through its gRPC proxy (IngressRpcs)."""

    def __init__(self, replicas: Any, max_body_bytes: int, affinity: bool) -> None:
        self._app = Ingress(replicas, max_body_bytes, affinity)
        self._replicas = replicas
        self._affinity = affinity

    def __serve_build_asgi_app__(self) -> Ingress:
        return self._app


def app_builder(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder: `args["flags"]`, `modelhost ray`'s flags (a bad one fails the deploy with
    the usage message)."""
    from modelhost.ray_serve.command import parse_flags

    settings, options = parse_flags(list(args.get("flags", [])))
    return build_application(settings, options)
