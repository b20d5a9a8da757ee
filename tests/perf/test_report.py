"""The sweep report's files: CSV and JSON round-trips, the PNG, the self-contained HTML page."""

from __future__ import annotations

import base64
import csv
import io
import re
from pathlib import Path

import numpy as np
import orjson
import pytest

from modelhost.perf.report import (
    COLUMNS,
    StepResult,
    percentiles,
    write_csv,
    write_html,
    write_json,
    write_plots,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SERVER = {"queue": 120.5, "compute_input": 10.0, "compute_infer": 850.25, "compute_output": 5.0, "success_count": 400}


def step(mode: str, load: float, protocol: str, server: bool, errors: tuple[str, ...] = ()) -> StepResult:
    latencies = np.random.default_rng(int(load)).gamma(2.0, 0.001 * load, 200)
    return StepResult(mode=mode, load=load, protocol=protocol, duration_s=2.0, requests=200, errors=len(errors),
                      throughput=100.0 * load, latency_ms=percentiles(latencies),
                      server_us=dict(SERVER) if server else {}, error_samples=errors)


def sweep(server: bool) -> list[StepResult]:
    return [step(mode, load, protocol, server) for mode in ("concurrency", "rate") for protocol in ("http", "grpc")
            for load in (1.0, 2.0, 4.0)]


def test_percentiles_match_numpy() -> None:
    sample = np.random.default_rng(7).exponential(0.01, 1000)
    result = percentiles(list(sample))
    assert list(result) == ["p50", "p90", "p95", "p99", "mean", "max"]
    for key, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert result[key] == pytest.approx(float(np.percentile(sample, q)) * 1000.0)
    assert result["mean"] == pytest.approx(float(sample.mean()) * 1000.0)
    assert result["max"] == pytest.approx(float(sample.max()) * 1000.0)
    assert percentiles(np.asarray([0.002, 0.004], dtype=np.float32))["mean"] == pytest.approx(3.0)


@pytest.mark.parametrize("empty", [[], np.empty(0)])
def test_percentiles_of_nothing_are_zero(empty: list[float] | np.ndarray) -> None:
    assert percentiles(empty) == {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}


def test_csv_round_trips(tmp_path: Path) -> None:
    steps = [step("concurrency", 4.0, "grpc", server=True), step("rate", 50.0, "http", server=False)]
    write_csv(tmp_path / "r.csv", steps)
    with (tmp_path / "r.csv").open(newline="") as file:
        assert next(csv.reader(file)) == list(COLUMNS)
        file.seek(0)
        rows = list(csv.DictReader(file))
    assert len(rows) == 2
    for row, expected in zip(rows, steps):
        assert (row["mode"], row["protocol"]) == (expected.mode, expected.protocol)
        assert float(row["load"]) == expected.load and float(row["throughput"]) == expected.throughput
        assert int(row["requests"]) == expected.requests and int(row["errors"]) == expected.errors
        for key, value in expected.latency_ms.items():
            assert float(row[f"{key}_ms"]) == value
    assert float(rows[0]["server_compute_infer_us"]) == SERVER["compute_infer"]
    assert [rows[1][f"server_{phase}_us"] for phase in ("queue", "compute_input", "compute_infer",
                                                        "compute_output")] == ["", "", "", ""]


def test_json_loads_back(tmp_path: Path) -> None:
    steps = [step("concurrency", 1.0, "http", True, errors=("deadline exceeded",)), step("rate", 9, "grpc", False)]
    meta = {"model": "simple", "server": "http://localhost:8000", "path": tmp_path, "workers": np.int64(2)}
    write_json(tmp_path / "r.json", steps, meta)
    text = (tmp_path / "r.json").read_text()
    assert text.startswith('{\n  "meta"')  # OPT_INDENT_2
    document = orjson.loads(text)
    assert document["meta"] == {"model": "simple", "server": "http://localhost:8000", "path": str(tmp_path),
                                "workers": 2}
    assert len(document["steps"]) == 2
    first = document["steps"][0]
    assert first["latency_ms"] == steps[0].latency_ms and first["server_us"] == SERVER
    assert first["error_samples"] == ["deadline exceeded"] and document["steps"][1]["server_us"] == {}
    assert StepResult(**{**first, "error_samples": tuple(first["error_samples"])}) == steps[0]


@pytest.mark.parametrize("server", [True, False])
def test_plot_is_a_png(tmp_path: Path, server: bool) -> None:
    from matplotlib.image import imread

    write_plots(tmp_path / "p.png", sweep(server), "sweep <1>")
    data = (tmp_path / "p.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = imread(io.BytesIO(data), format="png")
    height, width = image.shape[:2]
    assert height >= 300 and width >= (1000 if server else 600)  # the second panel widens the figure
    assert float(np.std(image[..., :3])) > 0.01  # something was drawn, not one flat colour


def test_plot_of_no_steps(tmp_path: Path) -> None:
    write_plots(tmp_path / "p.png", [], "nothing")
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("server", [True, False])
def test_html_is_self_contained_and_escaped(tmp_path: Path, server: bool) -> None:
    png = PNG_SIGNATURE + b"not really a png"
    steps = sweep(server) + [step("rate", 8.0, "http", server, errors=("<b>refused</b>",))]
    meta = {"model": "<script>alert(1)</script>", "url": "localhost:8001", "loads": [1, 2]}
    write_html(tmp_path / "r.html", steps, meta, png, title="perf & <co>")
    page = (tmp_path / "r.html").read_text()
    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in page
    assert "<script" not in page.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;refused&lt;/b&gt;" in page and "<title>perf &amp; &lt;co&gt;</title>" in page
    assert not re.search(r"https?://", page)
    assert re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page) == [f"data:image/png;base64,"
                                                                          f"{base64.b64encode(png).decode()}"]
    assert "<link" not in page and "@import" not in page
    for column in COLUMNS:
        assert f"<th>{column}</th>" in page
    assert page.count("<tr>") == 1 + len(steps) + len(meta) + 1 + 1  # steps, meta, errors with their headers
    assert ("850.25" in page) == server


def test_write_report(tmp_path: Path) -> None:
    steps = sweep(True)[:2] + sweep(False)[-2:]
    paths = write_report(tmp_path / "out" / "run1", steps, {"model": "simple"}, "a sweep")
    assert paths == {"csv": tmp_path / "out/run1/results.csv", "json": tmp_path / "out/run1/results.json",
                     "png": tmp_path / "out/run1/latency.png", "html": tmp_path / "out/run1/report.html"}
    assert all(path.stat().st_size > 0 for path in paths.values())
    png = paths["png"].read_bytes()
    assert base64.b64encode(png).decode() in paths["html"].read_text()
    assert len(orjson.loads(paths["json"].read_bytes())["steps"]) == 4


def test_import_does_not_load_matplotlib() -> None:
    import subprocess
    import sys

    code = "import sys, modelhost.perf.report; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
