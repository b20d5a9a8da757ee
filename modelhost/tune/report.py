"""The tuner's output: the winning config.pbtxt, every trial as CSV and JSON, and a self-contained HTML page
with a PNG of each trial's capacity and the baseline's and winner's latency against throughput."""

from __future__ import annotations

import csv
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, text_format

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.perf.report import cell_text, html_page, html_table
from modelhost.tune.search import Trial

TRIAL_COLUMNS = ("trial", "dimension", "instances", "threads", "max_batch_size", "queue_delay_us", "preferred",
                 "split_size", "client_split", "throughput", "p99_ms", "concurrency", "seconds", "error")


def config_text(config: Mapping[str, Any]) -> str:
    """A configuration (Triton's JSON) as config.pbtxt text."""
    message = json_format.ParseDict(dict(config), ModelConfig(), ignore_unknown_fields=True)
    return text_format.MessageToString(message)


def trial_row(trial: Trial) -> dict[str, Any]:
    knobs = trial.knobs
    result = trial.result
    return {"trial": trial.index, "dimension": trial.dimension, "instances": knobs.instances, "threads": knobs.threads,
            "max_batch_size": knobs.max_batch_size, "queue_delay_us": knobs.queue_delay_us,
            "preferred": knobs.preferred, "split_size": knobs.split_size, "client_split": knobs.client_split,
            "throughput": result.throughput if result else None, "p99_ms": result.p99_ms if result else None,
            "concurrency": result.concurrency if result else None, "seconds": round(trial.seconds, 2),
            "error": trial.error}


def write_tune_report(directory: Path, trials: Sequence[Trial], baseline: Trial, final: Trial,
                      config: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Path]:
    """Write config.pbtxt, trials.csv, trials.json, tune.png and report.html into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in ("config.pbtxt", "trials.csv", "trials.json", "tune.png",
                                                 "report.html")}
    text = config_text(config)
    paths["config.pbtxt"].write_text(text, encoding="utf-8")
    rows = [trial_row(trial) for trial in trials]
    with paths["trials.csv"].open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=TRIAL_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    document = {"meta": dict(meta), "baseline": trial_row(baseline), "final": trial_row(final), "trials": rows,
                "config": dict(config)}
    paths["trials.json"].write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2, default=str))
    _plot(paths["tune.png"], trials, baseline, final, float(meta.get("p99_budget_ms", 0.0)))
    sections = ("<h2>Trials</h2>\n" + html_table([[cell_text(v) for v in row.values()] for row in rows], TRIAL_COLUMNS)
                + f"\n<h2>config.pbtxt</h2>\n<pre>{html.escape(text)}</pre>")
    page = html_page(f"modelhost tune: {meta.get('model', '')}", meta, paths["tune.png"].read_bytes(),
                     "trials and latency against throughput", sections)
    paths["report.html"].write_text(page, encoding="utf-8")
    return paths


def _plot(path: Path, trials: Sequence[Trial], baseline: Trial, final: Trial, budget_ms: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 5.5), dpi=100, layout="constrained")
    left, right = figure.subplots(1, 2)
    values = [trial.result.throughput if trial.result else 0.0 for trial in trials]
    colors = ["tab:green" if trial.knobs == final.knobs else "tab:blue" for trial in trials]
    left.bar(range(len(trials)), values, color=colors)
    left.set_xticks(range(len(trials)), [f"{t.index} {t.dimension}" for t in trials], rotation=60, ha="right",
                    fontsize=7)
    left.set_ylabel("requests/s within the p99 budget")
    left.set_title("every trial (green: the winner's knobs)")
    left.grid(True, axis="y", alpha=0.3)
    for trial, label in ((baseline, "baseline"), (final, "tuned")):
        if trial.result is None:
            continue
        steps = sorted(trial.result.steps, key=lambda step: step.load)
        right.plot([s.throughput for s in steps], [s.latency_ms["p99"] for s in steps], marker="o", label=label)
    if budget_ms:
        right.axhline(budget_ms, color="tab:red", linestyle="--", label=f"budget {budget_ms:g} ms")
    right.set_xlabel("requests/s")
    right.set_ylabel("p99 latency (ms)")
    right.set_title("p99 against throughput, concurrency doubling")
    right.grid(True, alpha=0.3)
    right.legend()
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png")
