"""The server's own account of a step: per-request averages of its queue and compute phases, from the
statistics extension read before and after the measured window (perf_analyzer's server-side breakdown)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def totals(statistics: Mapping[str, Any] | None) -> dict[str, tuple[int, int]]:
    """phase -> (count, ns) summed over the answer's model versions; {} when there are no statistics
    (counts arrive as strings over gRPC's JSON mapping of uint64)."""
    if not statistics:
        return {}
    result: dict[str, tuple[int, int]] = {}
    for model in statistics.get("model_stats", []):
        stats = model.get("inference_stats", {})
        for phase in ("success", *PHASES):
            entry = stats.get(phase, {})
            count, ns = result.get(phase, (0, 0))
            result[phase] = (count + int(entry.get("count", 0)), ns + int(entry.get("ns", 0)))
    return result


def per_request(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """Each phase's µs per successful request over the window, and "success_count"; {} without statistics."""
    if not before or not after:
        return {}
    successes = after["success"][0] - before["success"][0]
    if successes <= 0:
        return {"success_count": 0.0}
    result = {"success_count": float(successes)}
    for phase in PHASES:
        result[phase] = (after[phase][1] - before[phase][1]) / successes / 1000.0
    return result
