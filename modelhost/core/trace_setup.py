"""The server's tracer from the operator's `--trace-config` entries: the settings, and where traces go."""

from __future__ import annotations

from pathlib import Path

from modelhost.core.trace import Tracer
from modelhost.core.trace_config import check_trace_config
from modelhost.core.trace_file import TraceFile


def make_tracer(entries: tuple[str, ...], worker: int | None = None) -> Tracer:
    """Under --workers, each worker (`worker`, its index) writes a file of its own: `<file>.worker<index>`.
    ImportError when opentelemetry mode is asked for and its SDK is not installed."""
    startup = check_trace_config(entries)
    if startup.mode == "opentelemetry":
        from modelhost.core.trace_otel import OtelExport

        return Tracer(startup, OtelExport(startup))
    if not startup.file:
        return Tracer(startup)
    path = Path(startup.file)
    if worker is not None:
        path = path.with_name(f"{path.name}.worker{worker}")
    return Tracer(startup, TraceFile(path, startup.values.log_frequency, startup.max_file_bytes))
