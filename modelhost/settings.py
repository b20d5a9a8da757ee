"""ServerSettings: every knob of a server, read once from flags and the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("MODELHOST_CACHE_DIR") or Path(base) / "modelhost")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """`model_repository` None serves the built-in example repository (written under `cache_dir`)."""

    model_repository: Path | None = None
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_level: str = "info"
    strict_readiness: bool = False
    default_max_batch_size: int = 4
    http_max_body_bytes: int = 64 * 1024 * 1024
    graceful_shutdown_seconds: float = 30.0
    cpu_count: int = os.cpu_count() or 1
    workers: int = 1
    worker_index: int = 0  # set for each process of --workers
    cache_dir: Path = _default_cache_dir()
