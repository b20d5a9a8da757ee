"""What the operator sets for tracing when the server starts: Triton's `--trace-config [MODE,]SETTING=VALUE`.

Global settings (`level`, `rate`, `count`, `mode`) are the starting values the trace extension's API changes
at run time; the mode's own settings (`triton,file=...`, `opentelemetry,url=...`) are fixed for the server's
life: a client can change how often requests are traced, never where traces go.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
DEFAULT_URL = "http://localhost:4318/v1/traces"
DEFAULT_MAX_FILE_BYTES = 1024**3


@dataclass(frozen=True, slots=True)
class TraceValues:
    """The settings clients may change: which levels, one request in `rate` traced (0: none), how many traces
    before tracing stops (-1: no end), and how many traces each write of the file holds (0: one file at exit)."""

    levels: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0


@dataclass(frozen=True, slots=True)
class BatchExport:
    """OpenTelemetry's batch span processor: spans queued (the rest dropped), per export, and how often."""

    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_ms: int = 5000


@dataclass(frozen=True, slots=True)
class TraceStartup:
    values: TraceValues = TraceValues()
    mode: str = "triton"
    file: str = ""  # triton mode: where traces are written ("" none: tracing cannot be turned on)
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # every trace file together, over the server's life
    url: str = DEFAULT_URL  # opentelemetry mode: the OTLP/HTTP receiver
    resource: tuple[tuple[str, str], ...] = ()  # opentelemetry mode: resource attributes
    batch: BatchExport = field(default_factory=BatchExport)


def parse_trace_config(entries: tuple[str, ...]) -> TraceStartup:
    """The startup settings of `--trace-config` entries, in order; ValueError naming the bad one."""
    startup = TraceStartup()
    levels: list[str] = []
    for entry in entries:
        mode, _, setting = entry.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"--trace-config {entry!r} is not [MODE,]SETTING=VALUE")
        if mode and mode not in MODES:
            raise ValueError(f"--trace-config {entry!r}: mode {mode!r} is not one of {', '.join(MODES)}")
        if key == "level":
            levels.append(_level(value, entry))
            continue
        startup = _apply(startup, mode, key.replace("-", "_"), value, entry)
    if levels:
        if "OFF" in levels and len(levels) > 1:
            raise ValueError("--trace-config level=OFF cannot be given with other levels")
        startup = replace(startup, values=replace(startup.values, levels=tuple(dict.fromkeys(levels))))
    return startup


def check_trace_config(entries: tuple[str, ...]) -> TraceStartup:
    """The startup settings; ValueError when an entry is bad or tracing is on with nowhere to put traces."""
    startup = parse_trace_config(entries)
    if startup.mode == "triton" and not startup.file and startup.values.levels != ("OFF",):
        raise ValueError("--trace-config level=... needs a trace file: --trace-config triton,file=PATH")
    return startup


def _apply(startup: TraceStartup, mode: str, key: str, value: str, entry: str) -> TraceStartup:
    values, batch = startup.values, startup.batch
    if not mode and key in ("rate", "count", "mode"):
        if key == "mode":
            if value not in MODES:
                raise ValueError(f"--trace-config {entry!r}: mode must be one of {', '.join(MODES)}")
            return replace(startup, mode=value)
        if key == "rate":
            return replace(startup, values=replace(values, rate=_integer(value, entry, 0)))
        return replace(startup, values=replace(values, count=_integer(value, entry, -1)))
    if mode == "triton" and key == "file":
        return replace(startup, file=value)
    if mode == "triton" and key == "log_frequency":
        return replace(startup, values=replace(values, log_frequency=_integer(value, entry, 0)))
    if mode == "triton" and key == "max_file_bytes":
        return replace(startup, max_file_bytes=_integer(value, entry, 1))
    if mode == "opentelemetry" and key == "url":
        return replace(startup, url=value)
    if mode == "opentelemetry" and key == "resource":
        name, sep, attribute = value.partition("=")
        if not sep or not name:
            raise ValueError(f"--trace-config {entry!r}: a resource is KEY=VALUE")
        return replace(startup, resource=(*startup.resource, (name, attribute)))
    if mode == "opentelemetry" and key.startswith("bsp_"):
        name = key.removeprefix("bsp_").replace("schedule_delay", "schedule_delay_ms")
        if name not in BatchExport.__dataclass_fields__:
            raise ValueError(f"--trace-config {entry!r}: unknown batch span processor setting")
        return replace(startup, batch=replace(batch, **{name: _integer(value, entry, 1)}))
    where = f"{mode}," if mode else ""
    raise ValueError(f"--trace-config {entry!r}: unknown setting {where}{key}")


def _level(value: str, entry: str) -> str:
    if value.upper() not in LEVELS:
        raise ValueError(f"--trace-config {entry!r}: level must be one of {', '.join(LEVELS)}")
    return value.upper()


def _integer(value: str, entry: str, least: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise ValueError(f"--trace-config {entry!r}: the value must be an integer of at least {least}")
    return number
