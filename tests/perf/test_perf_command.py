"""`modelhost perf` against a real server: sweeps over HTTP and gRPC, closed and open loop, inputs from files,
the report's files; and its parts on their own (inputs, ranges, statistics deltas)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from modelhost.perf import server_stats
from modelhost.perf.command import _loads, build_parser
from modelhost.perf.inputs import InputError, file_requests, request_shapes, synthetic_requests
from modelhost.perf.report import COLUMNS
from modelhost.perf.workers import share
from tests.server import ServerProcess

RANK_METADATA = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 1000]}]}
FAST = ["--measurement-interval", "800", "--warmup", "0.2"]


def perf_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`modelhost perf`'s main in this process (no interpreter start-up): its exit status and stderr."""
    from modelhost.perf.command import main

    code = main(list(args))
    return code, capsys.readouterr().err


def read_report(directory: Path) -> tuple[list[dict[str, str]], dict]:
    with (directory / "results.csv").open() as file:
        reader = csv.DictReader(file)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    document = json.loads((directory / "results.json").read_text())
    assert (directory / "latency.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (directory / "report.html").read_text()
    assert "data:image/png;base64," in page and "<script" not in page
    return rows, document


def test_closed_loop_sweep_over_http_writes_the_report(example_server: ServerProcess, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from modelhost.cli import main  # the CLI's entry, `modelhost perf ...`, in this process

    code = main(["perf", "-m", "rank", "-u", example_server.url, "-b", "500", "--concurrency", "1,2", *FAST,
                 "-o", str(tmp_path / "report"), "-f", str(tmp_path / "latency.csv")])
    err = capsys.readouterr().err
    assert code == 0, err
    rows, document = read_report(tmp_path / "report")
    assert [(row["mode"], float(row["load"])) for row in rows] == [("concurrency", 1.0), ("concurrency", 2.0)]
    for row in rows:
        assert int(row["requests"]) > 0 and int(row["errors"]) == 0
        assert float(row["p50_ms"]) <= float(row["p99_ms"]) <= float(row["max_ms"])
        assert float(row["server_compute_infer_us"]) > 0  # the server's breakdown, read from its statistics
        assert abs(float(row["throughput"]) - int(row["requests"]) / 0.8) < 1e-6
    assert document["meta"]["batch_size"] == 500 and len(document["steps"]) == 2
    assert (tmp_path / "latency.csv").read_text() == (tmp_path / "report" / "results.csv").read_text()
    assert "concurrency 2:" in err and "infer/s" in err


def test_open_loop_over_grpc_from_two_processes(example_server: ServerProcess, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, err = perf_here(capsys, "-m", "tiny", "-i", "grpc", "-u", example_server.grpc_url, "--request-rate", "200",
                          "--processes", "2", *FAST, "-o", str(tmp_path))
    assert code == 0, err
    rows, document = read_report(tmp_path)
    assert rows[0]["mode"] == "rate" and rows[0]["protocol"] == "grpc"
    assert 100 < float(rows[0]["throughput"]) < 300  # Poisson arrivals at 200/s, over 0.8 s
    assert document["meta"]["processes"] == 2


def test_requests_from_a_file_of_real_requests(example_server: ServerProcess, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4), dtype=np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": x.reshape(-1).tolist()}]}
    (tmp_path / "requests.json").write_bytes(orjson.dumps([body, body]))
    code, err = perf_here(capsys, "-m", "tiny", "-u", example_server.url, "--input-data",
                          str(tmp_path / "requests.json"), *FAST, "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert int(read_report(tmp_path / "out")[0][0]["requests"]) > 0
    code, err = perf_here(capsys, "-m", "tiny", "-u", example_server.url, "--input-data", str(tmp_path / "missing.npy"))
    assert code == 2 and "does not exist" in err


def test_an_unreachable_server_or_model_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.server import free_port

    code, err = perf_here(capsys, "-m", "tiny", "-u", f"127.0.0.1:{free_port()}")
    assert code == 1 and "cannot connect" in err


def test_refusals_are_errors_of_the_step_not_retried(tmp_path: Path) -> None:
    from modelhost.perf.command import main
    from tests.client.fake_servers import http_server

    with http_server(["503:0", "ok"]) as (url, script):  # the first request refused, every other answered
        assert main(["-m", "m", "-u", url, "--measurement-interval", "500", "--warmup", "0", "--processes", "1",
                     "-o", str(tmp_path)]) == 0
    step = json.loads((tmp_path / "results.json").read_text())["steps"][0]
    assert step["errors"] == 1 and step["requests"] > 0 and "queue full" in step["error_samples"][0]


# --------------------------------------------------------------------------- parts


def test_shapes_follow_metadata_batch_size_and_given_dims() -> None:
    assert request_shapes(RANK_METADATA, 1024, 500, {}) == {"features": ("FP32", (500, 1000))}
    variable = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]}
    assert request_shapes(variable, 8, 2, {"ids": [39]}) == {"ids": ("INT64", (2, 39))}
    with pytest.raises(InputError, match="--shape ids"):
        request_shapes(variable, 8, 2, {})
    with pytest.raises(InputError, match="does not fit"):
        request_shapes(RANK_METADATA, 1024, 1, {"features": [999]})


def test_synthetic_requests() -> None:
    shapes = {"a": ("FP32", (2, 3)), "b": ("INT64", (2,)), "c": ("BYTES", (2, 1))}
    random = synthetic_requests(shapes, "random")
    assert len(random) == 16 and not np.array_equal(random[0]["a"], random[1]["a"])
    assert random[0]["b"].dtype == np.int64 and random[0]["c"].dtype == object
    zero = synthetic_requests(shapes, "zero")
    assert len(zero) == 1 and not zero[0]["a"].any()


def test_perf_analyzer_input_data_and_arrays(tmp_path: Path) -> None:
    shapes = {"x": ("FP32", (1, 4))}
    (tmp_path / "data.json").write_text(json.dumps({"data": [{"x": [1, 2, 3, 4]},
                                                             {"x": {"content": [5, 6, 7, 8], "shape": [1, 4]}}]}))
    requests = file_requests(tmp_path / "data.json", shapes)
    assert [r["x"].tolist() for r in requests] == [[[1, 2, 3, 4]], [[5, 6, 7, 8]]]
    np.save(tmp_path / "x.npy", np.ones((7, 4), np.float32))
    assert file_requests(tmp_path / "x.npy", shapes)[0]["x"].shape == (7, 4)
    np.savez(tmp_path / "wrong.npz", y=np.ones(3))
    with pytest.raises(InputError, match="lacks input"):
        file_requests(tmp_path / "wrong.npz", shapes)
    (tmp_path / "bad.json").write_text('{"data": [{"x": [1, 2, 3]}]}')
    with pytest.raises(InputError, match="3 values"):
        file_requests(tmp_path / "bad.json", shapes)


@pytest.mark.parametrize(("args", "expected"), [
    ([], ("concurrency", [1.0])),
    (["--concurrency-range", "1:7:2"], ("concurrency", [1.0, 3.0, 5.0, 7.0])),
    (["--concurrency", "1,2,4"], ("concurrency", [1.0, 2.0, 4.0])),
    (["--request-rate-range", "50:150:50"], ("rate", [50.0, 100.0, 150.0])),
    (["--request-rate", "12.5"], ("rate", [12.5])),
])
def test_load_levels(args: list[str], expected: tuple[str, list[float]]) -> None:
    assert _loads(build_parser().parse_args(["-m", "m", *args])) == expected


@pytest.mark.parametrize("args", [["--concurrency", "1.5"], ["--concurrency-range", "4:1"],
                                  ["--request-rate", "0"], ["--concurrency", "1", "--request-rate", "5"]])
def test_bad_load_levels(args: list[str]) -> None:
    with pytest.raises(ValueError):
        _loads(build_parser().parse_args(["-m", "m", *args]))


def test_statistics_deltas_per_request() -> None:
    def stats(success: int, queue_ns: int, infer_ns: int) -> dict:
        phase = {"count": str(success)}
        return {"model_stats": [{"inference_stats": {
            "success": phase, "queue": {**phase, "ns": str(queue_ns)}, "compute_infer": {**phase, "ns": infer_ns},
            "compute_input": {}, "compute_output": {}}}]}

    before = server_stats.totals(stats(10, 1_000_000, 5_000_000))
    after = server_stats.totals(stats(30, 3_000_000, 9_000_000))
    assert server_stats.per_request(before, after) == {"success_count": 20.0, "queue": 100.0, "compute_input": 0.0,
                                                       "compute_infer": 200.0, "compute_output": 0.0}
    assert server_stats.per_request({}, after) == {}


def test_load_is_shared_among_processes() -> None:
    assert share(5, 2, whole=True) == [3.0, 2.0]
    assert share(1, 3, whole=True) == [1.0, 0.0, 0.0]
    assert share(90.0, 3, whole=False) == [30.0, 30.0, 30.0]


def test_shared_flags_read_alike_and_bad_ones_are_named() -> None:
    from modelhost.perf.arguments import parse_processes, parse_shape, server_address

    assert server_address(None, "grpc") == "grpc://127.0.0.1:8001"
    assert server_address("10.0.0.2:9000", "http") == "http://10.0.0.2:9000"
    assert parse_processes("auto") == "auto" and parse_processes("3") == 3
    assert parse_shape("ids:39,2") == ("ids", [39, 2])
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="--processes"):
            parse_processes(bad)
    with pytest.raises(ValueError, match="--shape"):
        parse_shape("ids")


def test_tune_names_a_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from modelhost.tune.command import main

    with pytest.raises(SystemExit) as exited:
        main(["m", "--p99-ms", "5", "--processes", "abc"])
    assert exited.value.code == 2 and "--processes" in capsys.readouterr().err
