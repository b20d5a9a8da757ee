"""Tracing's parts without a server: the operator's --trace-config, the settings' rules, the trace file's bounds.
(The extension end to end, over HTTP and gRPC: tests/protocols/test_trace_extension.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from modelhost.core.trace import REQUEST_END, REQUEST_START, Trace, Tracer
from modelhost.core.trace_config import BatchExport, TraceValues, check_trace_config, parse_trace_config
from modelhost.core.trace_file import TraceFile
from modelhost.core.trace_settings import TraceSettings
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_checks import check_settings


def test_trace_config_reads_triton_syntax() -> None:
    startup = parse_trace_config((
        "level=TIMESTAMPS", "level=tensors", "rate=10", "count=5", "triton,file=/tmp/t.json",
        "triton,log-frequency=50", "opentelemetry,resource=a=b=c", "opentelemetry,bsp_schedule_delay=20",
        "opentelemetry,url=http://collector:4318/v1/traces"))
    assert startup.values == TraceValues(("TIMESTAMPS", "TENSORS"), 10, 5, 50)
    assert (startup.mode, startup.file, startup.url) == ("triton", "/tmp/t.json", "http://collector:4318/v1/traces")
    assert startup.resource == (("a", "b=c"),)
    assert startup.batch == BatchExport(schedule_delay_ms=20)


@pytest.mark.parametrize(("entry", "named"), [
    ("rate", "SETTING=VALUE"), ("rate=fast", "at least 0"), ("count=-2", "at least -1"), ("level=LOUD", "level"),
    ("jaeger,url=x", "mode 'jaeger'"), ("mode=zipkin", "mode must be"), ("triton,url=x", "unknown setting triton,url"),
    ("opentelemetry,bsp_colour=1", "batch span"), ("opentelemetry,resource=novalue", "KEY=VALUE"),
])
def test_bad_trace_config_is_refused_naming_the_entry(entry: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_trace_config((entry,))


def test_tracing_on_needs_somewhere_to_go() -> None:
    with pytest.raises(ValueError, match="triton,file"):
        check_trace_config(("level=TIMESTAMPS",))
    with pytest.raises(SettingsError, match="triton,file"):
        check_settings(ServerSettings(trace_config=("level=TIMESTAMPS",)))
    assert check_trace_config(("mode=opentelemetry", "level=TIMESTAMPS")).mode == "opentelemetry"
    # Without a sink, the API cannot turn tracing on either.
    with pytest.raises(ModelhostError) as raised:
        Tracer(parse_trace_config(())).update({"trace_level": ["TIMESTAMPS"]})
    assert raised.value.kind == ErrorKind.PRECONDITION


def test_rate_counts_requests_and_count_counts_down_per_scope() -> None:
    settings = TraceSettings(parse_trace_config(("level=TIMESTAMPS", "rate=3", "count=2", "triton,file=t")))
    taken = [settings.take(settings.sampling("a")) for _ in range(9)]
    assert taken == [False, False, True, False, False, True, False, False, False]
    assert settings.get()["trace_count"] == "0"
    settings.update({"trace_count": ["1"], "trace_rate": ["1"]}, "b")
    assert [settings.take(settings.sampling("b")) for _ in range(2)] == [True, False]
    assert settings.get("b")["trace_count"] == "0" and settings.get("a")["trace_count"] == "0"
    settings.update({"trace_count": None})  # back to the startup count, for every model without its own
    assert settings.get("a")["trace_count"] == "2" and settings.get("b")["trace_count"] == "0"


def test_a_refused_change_changes_nothing() -> None:
    settings = TraceSettings(parse_trace_config(("level=TIMESTAMPS", "triton,file=t")))
    before = settings.get("m")
    with pytest.raises(ModelhostError) as raised:
        settings.update({"trace_rate": ["2"], "trace_level": ["LOUD"]}, "m")
    assert raised.value.kind == ErrorKind.INVALID_INPUT and "trace_level" in raised.value.message
    assert settings.get("m") == before
    settings.update({"trace_level": ["OFF"]})
    assert not settings.active
    settings.update({"trace_level": ["TIMESTAMPS"]}, "m")  # one model on is tracing on
    assert settings.active


def traced(trace_id: int) -> Trace:
    trace = Trace(trace_id, "m", ("TIMESTAMPS",), {})
    trace.stamp(REQUEST_START, 10 + trace_id)
    trace.stamp(REQUEST_END, 20 + trace_id)
    return trace


def test_trace_file_writes_every_n_traces_then_the_rest_at_close(tmp_path: Path) -> None:
    async def run() -> None:
        file = TraceFile(tmp_path / "t.json", 2, 1 << 20)
        for trace_id in range(1, 6):
            file.add(traced(trace_id))
        await file.close()

    asyncio.run(run())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1", "t.json.2"]
    assert [r["id"] for r in json.loads((tmp_path / "t.json.1").read_text())] == [3, 4]
    assert json.loads((tmp_path / "t.json.2").read_text()) == [{
        "id": 5, "model_name": "m", "model_version": 0,
        "timestamps": [{"name": "REQUEST_START", "ns": 15}, {"name": "REQUEST_END", "ns": 25}]}]


def test_trace_file_stops_at_its_byte_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        file = TraceFile(tmp_path / "t.json", 1, 300)
        for trace_id in range(1, 6):
            file.add(traced(trace_id))
        await file.close()

    asyncio.run(run())
    written = sorted(tmp_path.iterdir())
    assert 0 < len(written) < 5 and sum(p.stat().st_size for p in written) <= 300
    assert caplog.text.count("max-file-bytes") == 1  # said once
