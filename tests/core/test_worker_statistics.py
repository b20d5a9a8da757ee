"""Statistics summed over --workers processes: the merge, and the Unix-socket exchange between workers."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from modelhost.core.statistics import ExecutionTiming, ModelStatistics
from modelhost.core.worker_statistics import WorkerStatistics, merge
from modelhost.errors import ErrorKind, ModelhostError, not_found


def stat(name: str, version: int, requests: int, batch: int, last: int) -> dict[str, Any]:
    statistics = ModelStatistics()
    for _ in range(requests):
        statistics.record_request(True, 1_000)
        statistics.record_execution(batch, 1, ExecutionTiming([10], 20, 30, 40))
    statistics.last_inference_ms = last
    return statistics.as_json(name, version)


def test_merge_sums_counts_durations_and_batches_and_keeps_the_latest_inference() -> None:
    one = [stat("a", 1, 3, 1, last=100), stat("b", 1, 1, 1, last=5)]
    two = [stat("a", 1, 2, 4, last=200), stat("c", 2, 1, 1, last=7)]
    merged = {(s["name"], s["version"]): s for s in merge([one, two])}
    a = merged[("a", "1")]
    assert (a["inference_count"], a["execution_count"], a["last_inference"]) == (3 * 1 + 2 * 4, 5, 200)
    assert a["inference_stats"]["success"] == {"count": 5, "ns": 5_000}
    assert a["inference_stats"]["compute_infer"] == {"count": 5, "ns": 5 * 30}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in a["batch_stats"]] == [(1, 3), (4, 2)]
    assert sorted(merged) == [("a", "1"), ("b", "1"), ("c", "2")]
    assert one[0]["inference_count"] == 3  # the parts are not changed


def test_merge_of_one_part_is_that_part() -> None:
    part = [stat("a", 1, 2, 2, last=1)]
    assert merge([part]) == part


def test_each_worker_answers_for_itself_and_a_silent_one_fails_the_request(tmp_path: Path) -> None:
    own = {0: [stat("m", 1, 1, 1, last=1)], 1: [stat("m", 1, 4, 1, last=9)], 2: []}

    def local(index: int) -> Any:
        def answer(name: str, version: str) -> list[dict[str, Any]]:
            if name == "nope":
                raise not_found("model 'nope'")
            return [s for s in own[index] if name in ("", s["name"])]
        return answer

    async def main() -> None:
        workers = [WorkerStatistics(tmp_path, index, 3) for index in range(3)]
        async def metrics(index: int) -> bytes:
            return f"metric {index}.0\n".encode()

        for index in (1, 2):
            await workers[index].serve(local(index), partial(metrics, index))
        gathered = await workers[0].gather("m", "")
        assert merge([own[0], *gathered])[0]["inference_count"] == 5
        assert await workers[0].gather_metrics() == ["metric 1.0\n", "metric 2.0\n"]
        assert await workers[0].gather("nope", "") == [[], []]  # a worker without the model adds nothing
        await workers[2].stop()
        with pytest.raises(ModelhostError) as caught:
            await workers[0].gather("", "")
        assert caught.value.kind is ErrorKind.UNAVAILABLE and "worker 2" in caught.value.message
        await workers[1].stop()

    asyncio.run(main())
