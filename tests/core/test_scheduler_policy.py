"""Scheduler: the policy read from config.pbtxt, and running cheap requests on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from modelhost.config.pbtxt import ConfigError
from modelhost.core import in_flight as in_flight_module
from modelhost.core import loop_gate
from modelhost.core.in_flight import InFlight
from modelhost.core.loop_gate import LONE_BUDGET_NS, MAX_BUDGET_NS, MIN_BUDGET_NS, PROBE_EVERY, LoopGate
from modelhost.core.policy import LevelPolicy
from modelhost.core.scheduler import LOOP_MAX_IN_PROGRESS, Scheduler
from modelhost.core.statistics import ModelStatistics
from tests.core.scheduler_harness import (
    THREADS_ONLY,
    on_loop_within,
    policy_of,
    rows_of,
    serving,
    tags_of,
)
from tests.fakes import Echo, Slow
from tests.helpers import run

# --------------------------------------------------------------------------- policy from config


def test_policy_from_config_reads_dynamic_batching() -> None:
    policy = policy_of("""
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 4, 8, 4 ]
          max_queue_delay_microseconds: 1500
          preserve_ordering: true
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 250000 }
          priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } }
        }""")
    assert policy.batching and policy.max_batch_size == 16
    assert policy.preferred_batch_sizes == (8, 4)
    assert policy.max_queue_delay_s == pytest.approx(0.0015)
    assert policy.preserve_ordering
    assert policy.default_level == 1
    assert policy.levels == (
        LevelPolicy(allow_timeout_override=True, delay_on_timeout=True),
        LevelPolicy(max_queue_size=5, default_timeout_s=0.25),
        LevelPolicy(max_queue_size=5, default_timeout_s=0.25),
    )


def test_policy_without_dynamic_batching_does_not_batch() -> None:
    policy = policy_of("max_batch_size: 8")
    assert not policy.batching and len(policy.levels) == 1


@pytest.mark.parametrize("config, match", [
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "default_priority_level"),
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 }", "default_priority_level"),
    ("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4, 16 ] }", "preferred_batch_size 16"),
    ("max_batch_size: 8 dynamic_batching { preferred_batch_size: 0 }", "preferred_batch_size 0"),
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }", "priority_queue_policy level 3"),
])
def test_policy_from_config_rejects_bad_configs(config: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        policy_of(config)


def test_default_priority_level_without_priority_levels_does_not_break_requests() -> None:
    """Triton checks default_priority_level only when priority_levels is set, and otherwise ignores it.
    Either it is ignored here too, or the config is rejected at load: never an error on every request."""
    config = "max_batch_size: 8 dynamic_batching { default_priority_level: 2 }"
    try:
        policy = policy_of(config)
    except ConfigError:
        return
    assert 0 <= policy.default_level < len(policy.levels), policy

    async def scenario() -> None:
        async with serving(config, Echo()) as h:
            await h.call(1)

    run(scenario())


# --------------------------------------------------------------------------- execution on the event loop

LOOP = on_loop_within(50_000)  # generous: a loaded CI machine must not push the fakes over budget
MAIN = threading.main_thread().name


def _threads_after_warmup(config: str, model: Echo, calls: int = 6) -> list[str]:
    """Run `calls` requests one after another; return the thread each ran on."""
    async def scenario() -> None:
        async with serving(config, model) as h:
            for tag in range(calls):
                await h.call(tag)

    run(scenario())
    return model.threads


def test_a_fast_model_runs_on_the_loop_once_measured() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 " + LOOP, Echo())
    assert threads[0] == "m:1#0"  # not measured yet: its instance thread
    assert set(threads[1:]) == {MAIN}


def test_a_fast_model_with_dynamic_batching_runs_on_the_loop_too() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 dynamic_batching { } " + LOOP, Echo())
    assert set(threads[1:]) == {MAIN}


def test_a_slow_model_never_runs_on_the_loop() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 " + on_loop_within(200), Slow(seconds=0.002))
    assert set(threads) == {"m:1#0"}


def test_the_loop_is_on_by_default_with_a_learned_budget() -> None:
    assert policy_of("max_batch_size: 8").inline_max_ns is None  # None: the gate learns it from handoffs
    assert policy_of("max_batch_size: 8 " + on_loop_within(7)).inline_max_ns == 7_000
    assert policy_of("max_batch_size: 8 " + THREADS_ONLY).inline_max_ns == 0
    assert set(_threads_after_warmup("max_batch_size: 8 " + THREADS_ONLY, Echo())) == {"m:1#0"}


def test_without_the_parameter_the_budget_is_learned_from_handoffs_and_probed() -> None:
    """The harness adds THREADS_ONLY to configs without the parameter, so this builds its scheduler itself.
    A fast model runs on the loop once its first request (on its thread) has measured a handoff, and
    every PROBE_EVERY-th request it could run there goes to its thread to measure another. (Not alone in the
    server: a lone request over the handoff budget would take the loop unprobed, test_a_lone_request_....)"""
    async def scenario() -> tuple[list[str], LoopGate]:
        model = Echo()
        in_flight = InFlight()
        in_flight.requests = 2
        scheduler = Scheduler("m:1", [model], policy_of("max_batch_size: 8"), ModelStatistics(), in_flight)
        try:
            for tag in range(1 + 2 * PROBE_EVERY):
                await scheduler.submit({"INPUT0": rows_of(tag)}, ["OUTPUT0"], 1)
        finally:
            await scheduler.stop()
        return model.threads, scheduler._gate

    threads, gate = run(scenario())
    assert gate.adaptive and MIN_BUDGET_NS <= gate.budget_ns <= MAX_BUDGET_NS
    assert threads[0] == "m:1#0"
    on_threads = threads.count("m:1#0")
    # The first and the two probes; a loaded machine may push a few of the fake's runs over budget.
    assert 3 <= on_threads <= 3 + 2 * PROBE_EVERY // 4, threads


def _lone_threads(config: str, model: Echo, calls: list[tuple[int, int]], pause: float = 0.0) -> list[str]:
    """Run (rows, requests in flight elsewhere) calls one after another on a scheduler with a learned budget,
    `pause` s apart; return the thread each ran on."""
    async def scenario() -> list[str]:
        in_flight = InFlight()
        scheduler = Scheduler("m:1", [model], policy_of(config), ModelStatistics(), in_flight)
        try:
            for tag, (rows, others) in enumerate(calls):
                in_flight.requests = others
                in_flight.arrived()  # as a front-end counts it
                await scheduler.submit({"INPUT0": rows_of(tag, rows)}, ["OUTPUT0"], rows)
                in_flight.requests = 0
                await asyncio.sleep(pause)
        finally:
            await scheduler.stop()
        return model.threads

    return run(scenario())


@pytest.fixture
def roomy_lone_budget() -> Iterator[None]:
    """A lone budget that a 1 ms model meets however loaded the machine running the tests is."""
    loop_gate.configure(200_000_000)
    yield
    loop_gate.configure(LONE_BUDGET_NS)


@pytest.mark.usefixtures("roomy_lone_budget")
def test_a_lone_request_runs_on_the_loop_within_the_lone_budget() -> None:
    """Slower than any handoff (so never on the loop among other requests), but alone in the server: nobody
    waits for the loop, and the handoff would be most of what the server adds."""
    model = Slow(seconds=0.001)
    threads = _lone_threads("max_batch_size: 8", model, [(2, 0), (2, 0), (1, 0), (4, 0), (4, 0)])
    assert threads == ["m:1#0", MAIN, MAIN, "m:1#0", MAIN]  # measured; lone; smaller; unseen size; seen


@pytest.mark.usefixtures("roomy_lone_budget")
def test_a_lone_request_stays_off_the_loop_for_a_while_after_the_server_was_crowded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An arrival while a lone request holds the loop is counted only once the loop is free: crowding seen
    between lone runs stands for it."""
    monkeypatch.setattr(in_flight_module, "QUIET_S", 0.3)
    threads = _lone_threads("max_batch_size: 8", Slow(seconds=0.001), [(2, 0), (2, 0), (2, 1), (2, 0), (2, 0)])
    assert threads == ["m:1#0", MAIN, "m:1#0", "m:1#0", "m:1#0"]  # crowded, and not quiet for 0.3 s since
    threads = _lone_threads("max_batch_size: 8", Slow(seconds=0.001), [(2, 0), (2, 1), (2, 0)], pause=0.35)
    assert threads == ["m:1#0", "m:1#0", MAIN]  # quiet for long enough again


def test_a_model_slower_than_the_lone_budget_stays_on_its_thread() -> None:
    model = Slow(seconds=(LONE_BUDGET_NS + 1_000_000) / 1e9)
    assert set(_lone_threads("max_batch_size: 8", model, [(1, 0)] * 3)) == {"m:1#0"}


@pytest.mark.parametrize("config", [
    "max_batch_size: 8 " + on_loop_within(50),  # the operator fixed the loop's budget
    "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100 }",
    'max_batch_size: 8 parameters { key: "request_split_size" value: { string_value: "1" } }',  # parts in parallel
])
def test_no_lone_request_on_the_loop(config: str) -> None:
    assert set(_lone_threads(config, Slow(seconds=0.001), [(2, 0)] * 3)) == {"m:1#0"}


def test_a_batching_delay_is_never_bypassed_on_the_loop() -> None:
    config = "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100 } " + LOOP
    assert set(_threads_after_warmup(config, Echo())) == {"m:1#0"}


def test_requests_larger_than_the_learned_rows_run_on_threads() -> None:
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 64 " + LOOP, model) as h:
            await h.call(0)  # thread, measured: 1 row (4 elements) fits, so the loop may take up to 2 rows
            await h.call(1, rows=2)  # loop: now up to 4 rows
            await h.call(2, rows=9)
        assert model.threads == ["m:1#0", MAIN, "m:1#0"]

    run(scenario())


def test_a_request_of_the_same_rows_but_larger_inner_dims_runs_on_threads() -> None:
    """The gate measures size in elements: one row of a long sequence is not the cheap row that opened it
    (and a client cannot stall the loop by sending one)."""
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 64 " + LOOP, model) as h:
            await h.call(0)  # thread, measured: 4 elements fit, so the loop may take up to 8
            await h.call(1)  # loop
            await h.call(2, width=4_000)
        assert model.threads == ["m:1#0", MAIN, "m:1#0"]

    run(scenario())


def test_loop_runs_are_counted_in_statistics() -> None:
    async def scenario() -> None:
        async with serving("max_batch_size: 8 " + LOOP, Echo()) as h:
            for tag in range(5):
                await h.call(tag, rows=2)
            assert h.statistics.execution_count == 5
            assert h.statistics.inference_count == 10

    run(scenario())


def test_a_model_whose_threads_gain_nothing_runs_on_the_loop_under_any_load() -> None:
    """One instance and no batching: its thread would run the same executions one at a time, plus the handoff."""
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 64 " + LOOP, model) as h:
            await h.call(0)
            h.in_flight.requests = 10 * LOOP_MAX_IN_PROGRESS
            await asyncio.gather(*(h.call(tag) for tag in range(1, 33)))
        assert set(model.threads[1:]) == {MAIN}

    run(scenario())


@pytest.mark.parametrize("config, count", [
    ("max_batch_size: 64 dynamic_batching { } " + LOOP, 1),  # its queued requests batch
    ("max_batch_size: 64 " + LOOP, 2),  # its instances run at once
])
def test_a_model_whose_threads_gain_from_load_leaves_the_loop_when_busy(config: str, count: int) -> None:
    async def scenario() -> None:
        models = [Echo() for _ in range(count)]
        async with serving(config, *models) as h:
            await h.call(0)
            await h.call(1)
            h.in_flight.requests = LOOP_MAX_IN_PROGRESS + 1
            await asyncio.gather(*(h.call(tag) for tag in range(2, 34)))
        runs = [(thread, size) for model in models for thread, size in zip(model.threads, model.sizes, strict=True)]
        assert (MAIN, 1) in runs  # quiet: on the loop
        assert sum(size for thread, size in runs if thread != MAIN) >= 32  # busy: all 32 on the instance threads

    run(scenario())


def test_a_busy_server_batches_on_threads_instead() -> None:
    """With more than LOOP_MAX_IN_PROGRESS requests in progress, even a cheap model's requests queue
    for its threads, where they batch; a quiet server brings them back to the loop."""
    async def scenario() -> None:
        model = Slow(gate=threading.Event())
        model.open()
        async with serving("max_batch_size: 64 dynamic_batching { } " + LOOP, model) as h:
            await h.call(0)
            await h.call(1)
            h.in_flight.requests = LOOP_MAX_IN_PROGRESS + 1
            assert model.gate is not None
            model.gate.clear()  # the first request on the thread holds it while the others queue behind it
            blocker = await h.hold(model, tag=2)
            queued = await h.queue(*range(3, 34))
            model.open()
            await asyncio.gather(blocker, *queued)
            assert set(model.threads[2:]) == {"m:1#0"}
            assert len(model.batches) < 2 + 32  # they batched
            h.in_flight.requests = LOOP_MAX_IN_PROGRESS
            await h.call(34)
        assert model.threads[:2] == ["m:1#0", MAIN] and model.threads[-1] == MAIN

    run(scenario())


class FailsOnThirteen(Echo):
    def infer(self, inputs: dict[str, np.ndarray], outputs: Any) -> dict[str, np.ndarray]:
        if 13 in tags_of(inputs):
            raise RuntimeError("boom")
        return super().infer(inputs, outputs)


def test_a_failure_on_the_loop_reaches_only_its_request() -> None:
    async def scenario() -> None:
        model = FailsOnThirteen()
        async with serving("max_batch_size: 8 " + LOOP, model) as h:
            await h.call(1)
            await h.call(2)
            with pytest.raises(RuntimeError, match="boom"):
                await h.call(13)
            await h.call(3)
        assert model.threads == ["m:1#0", MAIN, MAIN]

    run(scenario())
