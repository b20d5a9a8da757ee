"""pb_utils.MetricFamily and Metric (backends/python/triton_metrics.py) as Triton's python_backend tests use them:
what each kind allows, families and series shared by name and labels, their lifetime, the process's limits, and
an isolated worker's changes applied to the server's registry. /metrics itself: test_triton_python_api.py."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from modelhost.backends.python import triton_metrics
from modelhost.backends.python import triton_utils as pb_utils
from modelhost.backends.python.triton_metrics import Registry
from modelhost.backends.python.triton_metrics_export import CustomMetricsCollector
from modelhost.backends.python.triton_metrics_relay import WorkerMetrics, drain


def test_counter_and_gauge() -> None:
    counter = pb_utils.MetricFamily("t_counter", "a counter", pb_utils.MetricFamily.COUNTER)
    metric = counter.Metric(labels={"a": "1"})
    metric.increment(2.5)
    assert counter.Metric(labels={"a": "1"}).value() == 2.5  # the same labels: the same series
    for misuse in (lambda: metric.increment(-1), lambda: metric.set(3), lambda: metric.observe(1)):
        with pytest.raises(pb_utils.TritonModelException):
            misuse()
    gauges = pb_utils.MetricFamily("t_gauge", "a gauge", pb_utils.MetricFamily.GAUGE)  # held: as in Triton, a
    gauge = gauges.Metric()  # metric whose family is gone refuses to work
    gauge.increment(-2)
    assert gauge.value() == -2
    gauge.set(7)
    assert gauge.value() == 7
    with pytest.raises(pb_utils.TritonModelException):
        gauge.observe(1)


def test_histogram_and_its_buckets() -> None:
    family = pb_utils.MetricFamily("t_histogram", "a histogram", pb_utils.MetricFamily.HISTOGRAM)
    for buckets in (None, [2.5, 0.1], [1, 1, 2]):
        with pytest.raises(pb_utils.TritonModelException):
            family.Metric(labels={}, buckets=buckets)
    family.Metric(labels={"empty": "yes"}, buckets=[])
    metric = family.Metric(labels={"a": "b"}, buckets=[0.1, 1.0, 2.5])
    for value in (0.05, 1.5, 6.0):
        metric.observe(value)
    for misuse in (metric.value, lambda: metric.increment(1), lambda: metric.set(1)):
        with pytest.raises(pb_utils.TritonModelException):
            misuse()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CustomMetricsCollector())
    text = generate_latest(registry).decode()
    assert 't_histogram_bucket{a="b",le="1"} 1.0' in text and 't_histogram_bucket{a="b",le="+Inf"} 3.0' in text
    assert 't_histogram_count{a="b"} 3.0' in text and 't_histogram_sum{a="b"} 7.55' in text


def test_families_by_name_and_their_lifetime() -> None:
    first = pb_utils.MetricFamily("t_shared", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("t_shared", "second description", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="exists as a counter"):
        pb_utils.MetricFamily("t_shared", "x", pb_utils.MetricFamily.GAUGE)
    metric = second.Metric()
    del first
    metric.increment(1)  # the family lives while one MetricFamily of it does
    assert triton_metrics.REGISTRY.families["t_shared"].description == "first description"
    del second
    assert "t_shared" not in triton_metrics.REGISTRY.families
    with pytest.raises(pb_utils.TritonModelException, match="has been deleted"):
        metric.increment(1)


@pytest.mark.parametrize("name", ["nv_inference_count", "modelhost_x", "bad name", "1x"])
def test_names_the_server_cannot_export_are_refused(name: str) -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.MetricFamily(name, "x", pb_utils.MetricFamily.COUNTER)


def test_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_metrics, "MAX_SERIES", len_series() + 3)
    family = pb_utils.MetricFamily("t_bounded", "labels from clients", pb_utils.MetricFamily.COUNTER)
    for index in range(3):
        family.Metric(labels={"id": str(index)})
    with pytest.raises(pb_utils.TritonModelException, match="custom metric series"):
        family.Metric(labels={"id": "3"})
    family.Metric(labels={"id": "0"})  # a series it holds is not a new one
    with pytest.raises(pb_utils.TritonModelException, match="at most 16 labels"):
        family.Metric(labels={f"l{i}": "x" for i in range(17)})
    with pytest.raises(pb_utils.TritonModelException, match="at most 256 characters"):
        family.Metric(labels={"id": "x" * 257})
    monkeypatch.setattr(triton_metrics, "MAX_FAMILIES", len(triton_metrics.REGISTRY.families))
    with pytest.raises(pb_utils.TritonModelException, match="custom metric families"):
        pb_utils.MetricFamily("t_one_too_many", "x", pb_utils.MetricFamily.GAUGE)
    del family
    assert "t_bounded" not in triton_metrics.REGISTRY.families  # its series no longer count


def len_series() -> int:
    return triton_metrics.REGISTRY.series_count


def test_a_workers_changes_reach_the_server_registry() -> None:
    worker, server = Registry(), Registry()
    counter = worker.family("w_counter", "c", triton_metrics.COUNTER)
    gauge = worker.family("w_gauge", "g", triton_metrics.GAUGE)
    histogram = worker.family("w_histogram", "h", triton_metrics.HISTOGRAM)
    labels = (("model", "m"),)
    c = triton_metrics.Metric(counter, worker.series(counter, labels, None))
    g = triton_metrics.Metric(gauge, worker.series(gauge, labels, None))
    h = triton_metrics.Metric(histogram, worker.series(histogram, labels, (1.0,)))
    applied = WorkerMetrics(server)
    c.increment(2)
    g.set(5)
    g.increment(1)
    h.observe(0.5)
    applied.apply(drain(worker))
    assert drain(worker) == []  # nothing changed since
    c.increment(1)
    g.increment(-2)
    h.observe(3)
    applied.apply(drain(worker))
    assert server.families["w_counter"].series[labels].value == 3
    assert server.families["w_gauge"].series[labels].value == 4
    series = server.families["w_histogram"].series[labels]
    assert (series.counts, series.count, series.total) == ([1, 1], 2, 3.5)
    applied.close()
    assert not server.families
