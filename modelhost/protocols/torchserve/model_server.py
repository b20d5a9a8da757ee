"""`modelhost torchserve`: the `torchserve` command line (its flags, tsfs §A7.1 for where config.properties is
found), mapped onto modelhost's settings and what the TorchServe front-ends serve.

`--start` (the default) serves in the foreground until a signal, whether or not `--foreground` is given, and writes
its pid where `--stop` finds it: `--stop` stops the server `--start` started. Flags for TorchServe's Java parts
(log4j configuration, plugins, config snapshots) are accepted and named in the log.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from modelhost.protocols.torchserve.config_properties import (
    TorchServeConfig,
    TorchServeConfigError,
    default_config_file,
    environment_config_file,
    read_properties,
    torchserve_config,
)

PID_FILE = Path(tempfile.gettempdir()) / ".modelhost_torchserve.pid"
STOP_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class TorchServeSetup:
    """What `modelhost torchserve` serves beyond ServerSettings."""

    config: TorchServeConfig
    config_file: Path | None = None
    metrics_port: int = 0  # modelhost's own Triton-named metrics (--modelhost-metrics-port); 0: none
    notes: tuple[str, ...] = field(default=(), compare=False)  # accepted and not used, for the log


@dataclass(frozen=True, slots=True)
class TorchServeFlags:
    setup: TorchServeSetup
    stop: bool = False
    print_version: bool = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise TorchServeConfigError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="modelhost torchserve", description="serve TorchServe model archives as torchserve does")
    parser.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    parser.add_argument("--start", action="store_true", help="start the server (the default; it runs in the "
                                                             "foreground)")
    parser.add_argument("--stop", action="store_true", help="stop the server `--start` started")
    parser.add_argument("--foreground", action="store_true", help="accepted: the server always runs in the "
                                                                  "foreground")
    parser.add_argument("--ts-config", dest="ts_config", help="config.properties")
    parser.add_argument("--model-store", dest="model_store", help="where model archives are")
    parser.add_argument("--models", nargs="+", metavar="[NAME=]ARCHIVE", help="models to serve at start ('all': "
                                                                              "every archive of the model store)")
    parser.add_argument("--disable-token-auth", "--dt", dest="disable_token_auth", action="store_true")
    parser.add_argument("--enable-model-api", dest="enable_model_api", action="store_true")
    parser.add_argument("--modelhost-metrics-port", dest="metrics_port", type=int, default=0, metavar="PORT",
                        help="also serve modelhost's own (Triton-named) metrics on this port (default: none)")
    for name in ("--log-config", "--cpp-log-config", "--workflow-store", "--plugins-path", "--ppath"):
        parser.add_argument(name, dest=name.lstrip("-").replace("-", "_"), help=argparse.SUPPRESS)
    parser.add_argument("--no-config-snapshots", "--ncs", dest="no_config_snapshots", action="store_true",
                        help=argparse.SUPPRESS)
    return parser


def parse_flags(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> TorchServeFlags:
    """The command line and the config.properties it names (TS_CONFIG_FILE, --ts-config, ./config.properties);
    TorchServeConfigError naming the flag or key for what is wrong."""
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(list(argv))
    if args.stop or args.version:
        return TorchServeFlags(TorchServeSetup(TorchServeConfig()), stop=args.stop, print_version=args.version)
    config_file = environment_config_file(environ) or (Path(args.ts_config) if args.ts_config else None)
    config_file = config_file or default_config_file()
    properties = read_properties(config_file) if config_file is not None else {}
    overrides: dict[str, str] = {}
    if args.model_store:
        overrides["model_store"] = args.model_store
    if args.models:
        overrides["load_models"] = ",".join(args.models)
    if args.disable_token_auth:
        overrides["disable_token_authorization"] = "true"
    if args.enable_model_api:
        overrides["enable_model_api"] = "true"
    config = torchserve_config(properties, environ, overrides)
    if config.model_store is not None and not config.model_store.is_dir():
        raise TorchServeConfigError(f"model_store {config.model_store} is not a directory")
    if config.load_models and config.model_store is None and any(
            not os.path.isabs(entry.partition("=")[2] or entry) for entry in config.load_models):
        raise TorchServeConfigError("load_models names archives, but there is no model store (--model-store)")
    notes = [f"config.properties key '{key}' is accepted and not used by modelhost" for key in config.unused]
    notes += [f"config.properties key '{key}' is not a TorchServe key; ignored" for key in config.unknown]
    notes += [f"--{name.replace('_', '-')} is accepted and not used by modelhost"
              for name in ("log_config", "cpp_log_config", "workflow_store", "plugins_path", "ppath")
              if getattr(args, name)]
    return TorchServeFlags(TorchServeSetup(config, config_file, args.metrics_port, tuple(notes)))


def running_pid() -> int | None:
    """The pid of a server `--start` started that still runs."""
    try:
        pid = int(PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether the process runs: it exists and has not exited (a zombie its parent has yet to reap has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def write_pid_file() -> None:
    PID_FILE.write_text(str(os.getpid()))


def remove_pid_file() -> None:
    try:
        if PID_FILE.read_text().strip() == str(os.getpid()):
            PID_FILE.unlink()
    except OSError:
        pass


def stop_server() -> str:
    """`--stop`: stop the server whose pid `--start` wrote; TorchServe's words for what happened."""
    try:
        pid = int(PID_FILE.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return "TorchServe is not currently running."
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return "TorchServe has stopped."
        time.sleep(0.1)
    return f"TorchServe (pid {pid}) did not stop within {STOP_WAIT_S:g} s."
