"""A load sweep's results as files: CSV, JSON, a latency-against-throughput PNG and one self-contained HTML page.

Every writer is plain blocking file I/O, called once at the end of a sweep (never on an event loop)."""

from __future__ import annotations

import base64
import csv
import html
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LATENCY_KEYS = ("p50", "p90", "p95", "p99", "mean", "max")
SERVER_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
COLUMNS: tuple[str, ...] = (
    "mode", "load", "protocol", "duration_s", "requests", "errors", "throughput",
    "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms",
    "server_queue_us", "server_compute_input_us", "server_compute_infer_us", "server_compute_output_us",
)
DEFAULT_TITLE = "modelhost perf"


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step of a sweep: what was asked (concurrency or request rate) and what was measured."""

    mode: str  # "concurrency" (closed loop) or "rate" (open loop, Poisson arrivals)
    load: float  # the concurrency, or the requests/s asked
    protocol: str  # "http" or "grpc"
    duration_s: float  # the measured window
    requests: int  # completed without error in the window
    errors: int  # failed in the window
    throughput: float  # requests / duration_s
    latency_ms: dict[str, float]  # keys exactly LATENCY_KEYS
    # Per-request server-side averages from the statistics extension, in µs, keys among SERVER_PHASES and
    # "success_count" (a count, not µs); empty when the server has no statistics.
    server_us: dict[str, float]
    error_samples: tuple[str, ...] = ()  # a few distinct error messages


def percentiles(latencies_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    """The `latency_ms` dict (LATENCY_KEYS, in ms) of latencies in seconds; all zeros when there are none."""
    values = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if values.size == 0:
        return dict.fromkeys(LATENCY_KEYS, 0.0)
    p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
    return {"p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99),
            "mean": float(values.mean()), "max": float(values.max())}


def _cells(step: StepResult) -> dict[str, str | float | None]:
    # One step as COLUMNS -> value; None where the server gave no statistics.
    cells: dict[str, str | float | None] = {
        "mode": step.mode, "load": step.load, "protocol": step.protocol, "duration_s": step.duration_s,
        "requests": step.requests, "errors": step.errors, "throughput": step.throughput,
    }
    cells.update({f"{key}_ms": step.latency_ms.get(key) for key in LATENCY_KEYS})
    cells.update({f"server_{phase}_us": step.server_us.get(phase) for phase in SERVER_PHASES})
    return cells


def write_csv(path: Path, steps: Sequence[StepResult]) -> None:
    """Write one row per step under a header row of COLUMNS; a missing server value is an empty cell."""
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(_cells(step) for step in steps)


def write_json(path: Path, steps: Sequence[StepResult], meta: Mapping[str, Any]) -> None:
    """Write {"meta": meta, "steps": [every StepResult field]}; meta values orjson can't encode are written as str."""
    document = {"meta": dict(meta), "steps": [asdict(step) for step in steps]}
    option = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    path.write_bytes(orjson.dumps(document, option=option, default=str))


def write_plots(path: Path, steps: Sequence[StepResult], title: str) -> None:
    """Write a PNG of p50 and p99 latency against throughput, one line per (mode, protocol), and, when any step has
    server statistics, a second panel of each step's server-side time per request as stacked bars."""
    # Imported here so that importing this module (and the CLI) doesn't pay for matplotlib; a Figure with its own
    # Agg canvas keeps clear of pyplot's global state and of whatever backend the process has chosen.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with_server = any(phase in step.server_us for step in steps for phase in SERVER_PHASES)
    figure = Figure(figsize=(14 if with_server else 8, 5.5), dpi=100, layout="constrained")
    figure.suptitle(title)
    panels = figure.subplots(1, 2 if with_server else 1, squeeze=False)[0]
    _plot_latency(panels[0], steps)
    if with_server:
        _plot_server(panels[1], steps)
    FigureCanvasAgg(figure)  # attaches itself to the figure
    figure.savefig(path, format="png")


def _plot_latency(axes: Axes, steps: Sequence[StepResult]) -> None:
    groups: dict[tuple[str, str], list[StepResult]] = {}
    for step in steps:
        groups.setdefault((step.mode, step.protocol), []).append(step)
    for (mode, protocol), group in groups.items():
        group.sort(key=lambda step: step.load)  # sweep order: a saturated server's throughput may fall back
        throughput = [step.throughput for step in group]
        (p50,) = axes.plot(throughput, [step.latency_ms.get("p50", 0.0) for step in group], marker="o",
                           label=f"{protocol} {mode} p50")
        axes.plot(throughput, [step.latency_ms.get("p99", 0.0) for step in group], marker="^", linestyle="--",
                  color=p50.get_color(), label=f"{protocol} {mode} p99")
    axes.set_title("client latency against throughput")
    axes.set_xlabel("throughput (requests/s)")
    axes.set_ylabel("latency (ms)")
    axes.grid(True, alpha=0.3)
    if groups:
        axes.legend()


def _plot_server(axes: Axes, steps: Sequence[StepResult]) -> None:
    positions = np.arange(len(steps))
    bottom = np.zeros(len(steps))
    for phase in SERVER_PHASES:
        heights = np.array([step.server_us.get(phase, 0.0) for step in steps]) / 1000.0
        axes.bar(positions, heights, bottom=bottom, label=phase)
        bottom += heights
    axes.set_xticks(positions, [f"{step.protocol} {step.mode} {step.load:g}" for step in steps],
                    rotation=45, ha="right")
    axes.set_title("server time per request")
    axes.set_ylabel("ms")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.6em; }}
th {{ background: #f0f0f0; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
td:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 1em; }}
</style>
</head>
<body>
<h1>{title}</h1>
{meta}
<img alt="{alt}" src="data:image/png;base64,{png}">
{sections}
</body>
</html>
"""


def html_page(title: str, meta: Mapping[str, Any], png: bytes, alt: str, sections: str) -> str:
    """One self-contained page (no scripts, no external resources): the title (escaped here), a table of `meta`,
    the PNG as a data: URI, then `sections`, HTML the caller has escaped."""
    meta_rows = [[str(key), cell_text(value)] for key, value in meta.items()]
    return _PAGE.format(title=html.escape(title), meta=html_table(meta_rows), alt=html.escape(alt),
                        png=base64.b64encode(png).decode("ascii"), sections=sections)


def write_html(path: Path, steps: Sequence[StepResult], meta: Mapping[str, Any], png: bytes, *,
               title: str = DEFAULT_TITLE) -> None:
    """Write one self-contained page (no scripts, no external resources): the title, meta, the PNG embedded as a
    data: URI, the steps and their error samples. Every text from the caller is html-escaped."""
    step_rows = [[cell_text(value) for value in _cells(step).values()] for step in steps]
    error_rows = [[f"{step.protocol} {step.mode} {step.load:g}", sample] for step in steps
                  for sample in step.error_samples]
    sections = "<h2>Steps</h2>\n" + html_table(step_rows, COLUMNS)
    if error_rows:
        sections += "\n<h2>Errors</h2>\n" + html_table(error_rows, ("step", "error"))
    page = html_page(title, meta, png, "latency against throughput", sections)
    path.write_text(page, encoding="utf-8")


def cell_text(value: object) -> str:
    # A cell's text: floats to 6 significant digits (the CSV and JSON keep them whole), None empty, others as JSON.
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:.6g}"
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str).decode()


def html_table(rows: Sequence[Sequence[str]], header: Sequence[str] = ()) -> str:
    lines = ["<table>"]
    if header:
        lines.append("<tr>" + "".join(f"<th>{html.escape(cell)}</th>" for cell in header) + "</tr>")
    lines.extend("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    lines.append("</table>")
    return "\n".join(lines)


def write_report(directory: Path, steps: Sequence[StepResult], meta: Mapping[str, Any],
                 title: str = DEFAULT_TITLE) -> dict[str, Path]:
    """Write results.csv, results.json, latency.png and report.html into `directory` (created with its parents);
    return their paths by kind: "csv", "json", "png", "html"."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"csv": directory / "results.csv", "json": directory / "results.json",
             "png": directory / "latency.png", "html": directory / "report.html"}
    write_csv(paths["csv"], steps)
    write_json(paths["json"], steps, meta)
    write_plots(paths["png"], steps, title)
    write_html(paths["html"], steps, meta, paths["png"].read_bytes(), title=title)
    return paths
