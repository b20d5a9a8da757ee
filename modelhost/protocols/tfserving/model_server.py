"""`modelhost tfserving`: `tensorflow_model_server`'s command line (tsfs §B3.1), mapped onto modelhost's settings.

TF Serving's flags keep their names and meanings: `--port` is the gRPC port (V2's gRPC services share it),
`--rest_api_port` the HTTP port (0: none, as in TF Serving), models come from `--model_name`/`--model_base_path` or a
`--model_config_file`, batching from `--enable_batching` and a `--batching_parameters_file`. A flag TF Serving
has and modelhost has no use for is accepted and named in the log; one it cannot honour is an error, as is an
unknown flag or a bad value, each naming the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from modelhost.config.overrides import ModelOverrides
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving.config_files import (
    Batching,
    ConfigFileError,
    ServedModelEntry,
    batching_from,
    batching_parameters,
    read_batching_parameters,
    read_model_config,
    read_monitoring_path,
    version_batching_config,
)
from modelhost.store.model_list import ListedModel
from modelhost.store.paths import name_problem

DEFAULT_GRPC_PORT = 8500


@dataclass(frozen=True, slots=True)
class TfServingSetup:
    """What `modelhost tfserving` serves beyond ServerSettings: the models (and where they were read from),
    the config.pbtxt lines each gets, how outputs are written and where metrics are served."""

    models: tuple[ServedModelEntry, ...]
    model_config_file: Path | None = None
    model_config_poll_seconds: float = 0.0
    model_config: str = ""  # config.pbtxt lines for every model (scheduling, graph tag)
    per_model_batching: bool = False  # each model batched by its newest version's batching_params.pbtxt
    typed_outputs: bool = True
    model_warmup: bool = True  # replay assets.extra/tf_serving_warmup_requests
    metrics_path: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)  # flags accepted and not used, for the log

    def listed(self, models: Sequence[ServedModelEntry] | None = None) -> list[ListedModel]:
        version_config = version_batching_config if self.per_model_batching else None
        return [ListedModel(m.name, m.base_path, m.policy, m.latest_count, m.specific, self.model_config,
                            version_config) for m in (self.models if models is None else models)]


class TfServingFlagError(Exception):
    """A flag that is unknown, has a bad value, or asks for what modelhost cannot do; names the flag."""


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"'{text}' is not true or false")


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds >= 0")
    return value


# Flags TF Serving has that change nothing in modelhost, with why; each one given is named in the log.
_NOTED: dict[str, tuple[Callable[[str], object], str]] = {
    "rest_api_timeout_in_ms": (_natural, "the REST port does not time requests out (gRPC deadlines and queue "
                                         "timeouts still apply)"),
    "rest_api_num_threads": (_natural, "modelhost's HTTP transport runs on its event loop, not a thread pool"),
    "grpc_max_threads": (_natural, "modelhost's gRPC server runs on its event loop, not a thread pool"),
    "num_load_threads": (_natural, "modelhost loads each model on a thread of its own"),
    "num_unload_threads": (_natural, "modelhost unloads each model on a thread of its own"),
    "max_num_load_retries": (_natural, "a failed load is not retried; the model's status says why (END)"),
    "load_retry_interval_micros": (_natural, "a failed load is not retried"),
    "per_process_gpu_memory_fraction": (float, "modelhost runs models on CPU"),
    "tensorflow_session_config_file": (str, "sessions are TensorFlow's defaults with the parallelism flags"),
    "enable_signature_method_name_check": (_boolean, "classify and regress always check the method name"),
    "allow_version_labels_for_unavailable_models": (_boolean, "a label may name any version of the config"),
    "grpc_channel_arguments": (str, "gRPC keepalive and message size follow modelhost's own settings"),
    "num_request_iterations_for_warmup": (_natural, "each warmup record is replayed once"),
}
# Flags TF Serving has for what modelhost does not do; refused rather than silently changed.
_REFUSED = {
    "grpc_socket_path": "a Unix socket for gRPC",
    "platform_config_file": "platform configs (modelhost picks the backend from the model files)",
    "ssl_config_file": "TF Serving's SSL config file (use modelhost serve's --tls-cert-file and --tls-key-file)",
    "enable_grpc_healthcheck_service": "the gRPC health service",
    "rest_api_enable_cors_support": "CORS headers",
    "use_tflite_model": "TensorFlow Lite models",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelhost tfserving", allow_abbrev=False,
        description="Serve SavedModels as tensorflow_model_server does, with its flags (see docs/tfserving.md).")
    add = parser.add_argument
    add("--port", type=_natural, default=DEFAULT_GRPC_PORT, help="gRPC port (default 8500; 0: none)")
    add("--rest_api_port", type=_natural, default=0, help="REST port (default 0: none)")
    add("--model_name", default="default", help="the model's name without --model_config_file (default 'default')")
    add("--model_base_path", help="directory of the model's numbered version directories")
    add("--model_config_file", type=Path, help="ModelServerConfig in text format: the models to serve")
    add("--model_config_file_poll_wait_seconds", type=_seconds, default=0.0,
        help="re-read --model_config_file this often (default 0: never)")
    add("--file_system_poll_wait_seconds", type=_seconds, default=1.0,
        help="look for new and removed versions this often (default 1; 0: once, at start)")
    add("--enable_batching", type=_boolean, nargs="?", const=True, default=False, help="batch requests")
    add("--batching_parameters_file", type=Path, help="BatchingParameters in text format")
    add("--enable_per_model_batching_parameters", type=_boolean, nargs="?", const=True, default=False,
        help="with --enable_batching: each model is batched by its newest version's batching_params.pbtxt "
             "(a model without one is not batched) instead of --batching_parameters_file")
    add("--tensorflow_intra_op_parallelism", type=_natural, default=0, help="threads within an op (0: automatic)")
    add("--tensorflow_inter_op_parallelism", type=_natural, default=0, help="ops at once (0: automatic)")
    add("--tensorflow_session_parallelism", type=_natural, default=0,
        help="both of the above where they are not given (0: automatic)")
    add("--saved_model_tags", default="serve", help="the MetaGraph to load (default 'serve')")
    add("--monitoring_config_file", type=Path, help="MonitoringConfig in text format: Prometheus metrics")
    add("--enable_model_warmup", type=_boolean, nargs="?", const=True, default=True,
        help="replay each version's assets.extra/tf_serving_warmup_requests before it serves (default true)")
    add("--enable_serialization_as_tensor_content", type=_boolean, nargs="?", const=True, default=False,
        help="write Predict outputs as tensor_content rather than typed values")
    add("--version", action="store_true", help="print the version and exit")
    for name, (kind, why) in _NOTED.items():
        add(f"--{name}", type=kind, nargs="?" if kind is _boolean else None,
            const=True if kind is _boolean else None, help=f"accepted: {why}")
    for name, what in _REFUSED.items():
        add(f"--{name}", nargs="?", const="true", help=f"refused: modelhost does not serve {what}")
    return parser


@dataclass(frozen=True, slots=True)
class TfServingFlags:
    """The parsed command line: ports, where models come from, and the setup."""

    grpc_port: int
    rest_api_port: int
    file_system_poll_seconds: float
    overrides: ModelOverrides
    setup: TfServingSetup
    print_version: bool = False


def parse_flags(argv: Sequence[str]) -> TfServingFlags:
    """TF Serving's flags; TfServingFlagError naming the flag for a value or combination TF Serving refuses too."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise TfServingFlagError(f"unknown flag {unknown[0]} (TF Serving's tensorflow_model_server has none such, "
                                 "or modelhost does not know it)")
    for name, what in _REFUSED.items():
        value = getattr(args, name)
        if value is not None and value.lower() not in ("false", "0", ""):
            raise TfServingFlagError(f"--{name}: modelhost does not serve {what}")
    notes = tuple(f"--{name} is accepted but changes nothing: {why}" for name, (_, why) in _NOTED.items()
                  if getattr(args, name) is not None)
    if args.version:
        return TfServingFlags(0, 0, 0, ModelOverrides(), TfServingSetup(()), print_version=True)
    if args.rest_api_port and args.rest_api_port == args.port:
        raise TfServingFlagError(f"--rest_api_port {args.rest_api_port} must differ from --port")
    if args.batching_parameters_file is not None and not args.enable_batching:
        notes += ("--batching_parameters_file is read only with --enable_batching, as in TF Serving",)
    per_model = args.enable_per_model_batching_parameters and args.enable_batching
    if args.enable_per_model_batching_parameters and not args.enable_batching:
        notes += ("--enable_per_model_batching_parameters is read only with --enable_batching, as in TF Serving",)
    if per_model and args.batching_parameters_file is not None:
        notes += ("--batching_parameters_file is checked but not applied: with --enable_per_model_batching_"
                  "parameters each model's own batching_params.pbtxt is, as in TF Serving",)
    try:
        models, config_file = _models(args)
        batching = _batching(args)
        metrics_path = None if args.monitoring_config_file is None else read_monitoring_path(
            args.monitoring_config_file)
    except ConfigFileError as exc:
        raise TfServingFlagError(str(exc)) from None
    intra = args.tensorflow_intra_op_parallelism or args.tensorflow_session_parallelism
    inter = args.tensorflow_inter_op_parallelism or args.tensorflow_session_parallelism
    if per_model:
        batching = None  # each model's own, read with its versions (model_list.ListedModel.version_config)
    overrides = replace(batching.overrides if batching else ModelOverrides(),
                        intra_op_threads=intra or None, inter_op_threads=inter or None)
    setup = TfServingSetup(
        models=tuple(models),
        model_config_file=config_file,
        model_config_poll_seconds=args.model_config_file_poll_wait_seconds if config_file else 0.0,
        model_config=_model_config(args.saved_model_tags, batching),
        per_model_batching=per_model,
        typed_outputs=not args.enable_serialization_as_tensor_content,
        model_warmup=args.enable_model_warmup,
        metrics_path=metrics_path,
        notes=notes,
    )
    return TfServingFlags(args.port, args.rest_api_port, args.file_system_poll_wait_seconds, overrides, setup)


def _models(args: argparse.Namespace) -> tuple[list[ServedModelEntry], Path | None]:
    if args.model_config_file is not None:
        return read_model_config(args.model_config_file), args.model_config_file.resolve()
    if not args.model_base_path:
        raise TfServingFlagError("--model_base_path is required (or --model_config_file, which lists the models)")
    problem = name_problem(args.model_name)
    if problem is not None:
        raise TfServingFlagError(f"--model_name {args.model_name!r} {problem}")
    base = Path(args.model_base_path)
    if not base.is_dir():
        raise TfServingFlagError(f"--model_base_path {base} is not a directory")
    return [ServedModelEntry(args.model_name, base.resolve())], None


def _batching(args: argparse.Namespace) -> Batching | None:
    if not args.enable_batching:
        return None
    if args.batching_parameters_file is None:
        return batching_from(pb.BatchingParameters(), "--enable_batching")
    return read_batching_parameters(args.batching_parameters_file)


def _model_config(tags: str, batching: Batching | None) -> str:
    """config.pbtxt lines every model gets: the graph tag, and what batching adds to the overrides."""
    lines = []
    if tags != "serve":
        lines.append(f'parameters {{ key: "TF_GRAPH_TAG" value {{ string_value: "{_quoted(tags)}" }} }}')
    if batching is not None and batching.allowed_batch_sizes:
        sizes = ", ".join(str(size) for size in batching.allowed_batch_sizes)
        lines.append(f"dynamic_batching {{ preferred_batch_size: [ {sizes} ] }}")
    if batching is not None:
        lines += batching_parameters(batching)
    return "".join(line + "\n" for line in lines)


def _quoted(text: str) -> str:
    if any(ch in text for ch in '"\\\n'):
        raise TfServingFlagError(f"--saved_model_tags '{text}' has a quote, backslash or newline")
    if "," in text:
        raise TfServingFlagError(f"--saved_model_tags '{text}': modelhost loads a MetaGraph by one tag")
    return text
