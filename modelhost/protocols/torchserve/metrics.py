"""TorchServe's metrics API (tsfs §A3), default port 8082: `GET /metrics[?name[]=...]` in Prometheus text, with
TorchServe's names and labels, by `metrics_mode`: `prometheus` every metric, `legacy` the three `ts_*` ones, `log`
(TorchServe's default) none (TorchServe writes them to its log files; modelhost's own, Triton-named metrics are on
`--modelhost-metrics-port`).

- `ts_inference_requests_total`, `ts_inference_latency_microseconds` {model_name, model_version, hostname}:
  predictions accepted for a registered model, and their end-to-end time summed; model_version is "default"
  when the URL names none, as in TorchServe;
- `ts_queue_latency_microseconds` {same}: time requests waited in the model's queue, summed, from the core's
  statistics, under the version that ran them;
- `Requests2XX`, `Requests4XX`, `Requests5XX` {Level, Hostname}: the API ports' answers by status class;
- `MemoryUsed`, `MemoryAvailable` (MB), `MemoryUtilization` (%), `DiskUsage`, `DiskAvailable` (GB),
  `DiskUtilization` (%), `CPUUtilization` (% since the previous scrape) {Level, Hostname}.

Names are TorchServe's exactly, exposed untyped as modelhost's other metrics are (metrics.py says why).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
TS_METRICS = ("ts_inference_requests_total", "ts_inference_latency_microseconds", "ts_queue_latency_microseconds")
QueueTimes = Callable[[], list[tuple[str, str, float]]]  # (model, version, µs waited in its queue in all)


class TorchServeMetrics:
    def __init__(self, mode: str, queue_times: QueueTimes) -> None:
        self.mode = mode
        self.hostname = socket.gethostname()
        self._queue_times = queue_times
        self._requests: dict[tuple[str, str], int] = {}
        self._latency: dict[tuple[str, str], float] = {}
        self._statuses = {"2XX": 0, "4XX": 0, "5XX": 0}
        self._cpu: tuple[int, int] | None = _cpu_times()

    def accepted(self, model: str, version: str | None) -> None:
        key = (model, version or "default")
        self._requests[key] = self._requests.get(key, 0) + 1

    def answered(self, model: str, version: str | None, microseconds: float) -> None:
        key = (model, version or "default")
        self._latency[key] = self._latency.get(key, 0.0) + microseconds

    def status(self, status: int) -> None:
        self._statuses["2XX" if 200 <= status < 300 else "4XX" if 400 <= status < 500 else "5XX"] += 1

    def collect(self) -> Iterator[Metric]:
        if self.mode == "log":
            return
        yield self._model_metric(TS_METRICS[0], "Count", self._requests)
        yield self._model_metric(TS_METRICS[1], "Microseconds", self._latency)
        yield self._model_metric(TS_METRICS[2], "Microseconds",
                                 {(model, version): waited for model, version, waited in self._queue_times()})
        if self.mode == "legacy":
            return
        host = {"Level": "Host", "Hostname": self.hostname}
        for status, count in self._statuses.items():
            yield _metric(f"Requests{status}", "counter", "Count", [(host, count)])
        for name, kind, unit, value in self._system():
            yield _metric(name, kind, unit, [(host, value)])

    def _model_metric(self, name: str, unit: str, values: dict[tuple[str, str], float] | dict[tuple[str, str], int]
                      ) -> Metric:
        return _metric(name, "counter", unit, [({"model_name": model, "model_version": version,
                                                  "hostname": self.hostname}, value)
                                                for (model, version), value in sorted(values.items())])

    def _system(self) -> list[tuple[str, str, str, float]]:
        memory = _meminfo()
        total, available = memory.get("MemTotal", 0), memory.get("MemAvailable", 0)
        disk = shutil.disk_usage("/")
        cpu, self._cpu = self._cpu, _cpu_times()
        busy = 0.0
        if cpu is not None and self._cpu is not None and self._cpu[1] > cpu[1]:
            busy = 100.0 * (self._cpu[0] - cpu[0]) / (self._cpu[1] - cpu[1])
        return [
            ("CPUUtilization", "gauge", "Percent", round(busy, 1)),
            ("MemoryUsed", "gauge", "Megabytes", (total - available) / 1024),
            ("MemoryAvailable", "gauge", "Megabytes", available / 1024),
            ("MemoryUtilization", "gauge", "Percent", round(100.0 * (total - available) / total, 1) if total else 0),
            ("DiskUsage", "gauge", "Gigabytes", round(disk.used / 1024**3, 3)),
            ("DiskAvailable", "gauge", "Gigabytes", round(disk.free / 1024**3, 3)),
            ("DiskUtilization", "gauge", "Percent", round(100.0 * disk.used / disk.total, 1) if disk.total else 0),
        ]

    def render(self, names: set[str] | None = None) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Selected(self, names))
        return generate_latest(registry)


class _Selected:
    def __init__(self, metrics: TorchServeMetrics, names: set[str] | None) -> None:
        self._metrics, self._names = metrics, names

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._metrics.collect() if self._names is None or m.name in self._names)


def _metric(name: str, kind: str, unit: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    metric = Metric(name, f"Torchserve prometheus {kind} metric with unit: {unit}", "unknown")
    for labels, value in samples:
        metric.add_sample(name, labels, float(value))
    return metric


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in kB."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return values


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)
