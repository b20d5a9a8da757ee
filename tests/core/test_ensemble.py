"""Ensemble unit tests: DAG checks, concurrent steps, errors, batching, no copies, resolve per request, stop.

Composing models are real Schedulers over fake backend models (defined here: they compute a function
of their inputs), built into ServedModels from config.pbtxt text; their instances run on their threads.
Everything runs on one asyncio loop per test (asyncio.run, no plugin); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from modelhost.backends.base import Model
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.ensemble import LATEST, EnsemblePlan, EnsembleScheduler
from modelhost.core.in_flight import InFlight
from modelhost.core.model_hold import ModelHold
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.scheduler import Scheduler
from modelhost.core.served_model import ServedModel
from modelhost.core.signature import Signature
from modelhost.core.statistics import ModelStatistics
from modelhost.errors import ErrorKind, invalid, not_found
from tests.helpers import rejected_async, run, until

Arrays = dict[str, np.ndarray]
THREADS_ONLY = 'parameters { key: "inline_max_microseconds" value: { string_value: "0" } }'
WAIT = 5.0  # longest any fake waits for the test


class Compute(Model):
    """Returns fn(inputs) (only the requested outputs); `before` runs first (a barrier, a gate).

    Records the inputs of every batch, the arrays it returned and the threads it ran on."""

    def __init__(self, fn: Callable[[Arrays], Arrays], before: Callable[[], Any] | None = None) -> None:
        self.fn = fn
        self.before = before
        self.batches: list[Arrays] = []
        self.returned: list[Arrays] = []
        self.threads: list[str] = []

    @property
    def sizes(self) -> list[int]:
        return [len(next(iter(b.values()))) for b in self.batches]

    def infer(self, inputs: Arrays, outputs: Sequence[str]) -> Arrays:
        self.batches.append(dict(inputs))
        self.threads.append(threading.current_thread().name)
        if self.before is not None:
            self.before()
        results = self.fn(inputs)
        self.returned.append(results)
        return {name: results[name] for name in outputs}


def gate_of(event: threading.Event) -> Callable[[], None]:
    def wait() -> None:
        if not event.wait(WAIT):
            raise TimeoutError("the test never opened the gate")

    return wait


def add(n: float) -> Callable[[Arrays], Arrays]:
    return lambda i: {"OUT": i["IN"] + np.float32(n)}


def times(n: float) -> Callable[[Arrays], Arrays]:
    return lambda i: {"OUT": i["IN"] * np.float32(n)}


def tensor(name: str, dims: str = "[ 4 ]", dtype: str = "TYPE_FP32") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} }}'


UNARY = f"input [ {tensor('IN')} ] output [ {tensor('OUT')} ]"
BINARY = f"input [ {tensor('A')}, {tensor('B')} ] output [ {tensor('OUT')} ]"


def served(name: str, model: Model, config: str = "", io: str = UNARY, version: int = 1,
           in_flight: InFlight | None = None) -> ServedModel:
    """On its instance thread only, unless given the server's `in_flight`: then the loop gate learns."""
    text = f'name: "{name}" {config or "max_batch_size: 8"} {io} {"" if in_flight else THREADS_ONLY}'
    parsed = parse_config(text)
    statistics = ModelStatistics()
    scheduler = Scheduler(f"{name}:{version}", [model], SchedulingPolicy.from_config(parsed), statistics,
                          in_flight)
    return ServedModel(name, version, parsed, Signature.from_config(parsed), scheduler, statistics)


class Repository:
    """name -> version -> ServedModel; `resolve` is what the ensemble gets."""

    def __init__(self, *models: ServedModel) -> None:
        self.models: dict[str, dict[int, ServedModel]] = {}
        self.retired: list[ServedModel] = []
        for model in models:
            self.put(model)

    def put(self, model: ServedModel) -> None:
        versions = self.models.setdefault(model.name, {})
        if model.version in versions:
            self.retired.append(versions[model.version])
        versions[model.version] = model

    def acquire(self, name: str, version: str) -> ModelHold:
        def hold() -> ServedModel:
            served = self.resolve(name, version)
            served.pins.hold()
            return served

        return ModelHold(hold)

    def resolve(self, name: str, version: str) -> ServedModel:
        versions = self.models.get(name)
        if not versions:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        key = int(version) if version else max(versions)
        if key not in versions:
            raise not_found(f"model '{name}' version {version} is not found")
        return versions[key]

    async def stop(self) -> None:
        models = self.retired + [m for versions in self.models.values() for m in versions.values()]
        await asyncio.wait_for(asyncio.gather(*(m.scheduler.stop() for m in models)), WAIT)


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps} }}'


def ensemble_config(name: str, inputs: Sequence[str], outputs: Sequence[str], *steps: str,
                    max_batch_size: int = 8) -> str:
    return (
        f'name: "{name}" platform: "ensemble" max_batch_size: {max_batch_size} '
        f"input [ {', '.join(tensor(n) for n in inputs)} ] output [ {', '.join(tensor(n) for n in outputs)} ] "
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}"
    )


def plan_of(text: str) -> EnsemblePlan:
    return EnsemblePlan.from_config(parse_config(text))


CHAIN = ensemble_config(
    "chain", ["x"], ["y"],
    step("add1", {"IN": "x"}, {"OUT": "t"}),
    step("double", {"IN": "t"}, {"OUT": "y"}),
)
DIAMOND = ensemble_config(
    "diamond", ["x"], ["y"],
    step("pre", {"IN": "x"}, {"OUT": "a"}),
    step("left", {"IN": "a"}, {"OUT": "b"}),
    step("right", {"IN": "a"}, {"OUT": "c"}),
    step("sum", {"A": "b", "B": "c"}, {"OUT": "y"}),
)


def add_inputs(i: Arrays) -> Arrays:
    return {"OUT": i["A"] + i["B"]}


def rows_of(tag: int, rows: int = 1) -> np.ndarray:
    return (tag * 100 + np.arange(rows * 4)).reshape(rows, 4).astype(np.float32)


# --------------------------------------------------------------------------- execution


def test_a_chain_runs_its_steps_in_order_through_the_composing_schedulers() -> None:
    async def scenario() -> None:
        add1, double = Compute(add(1)), Compute(times(2))
        repo = Repository(served("add1", add1), served("double", double))
        plan = plan_of(CHAIN)
        plan.check_models(repo.resolve)
        assert plan.composing_models() == [("add1", LATEST), ("double", LATEST)]
        ensemble = EnsembleScheduler("chain:1", plan, repo.acquire)
        x = rows_of(1, rows=3)
        result = await ensemble.submit({"x": x}, ["y"], 3)
        assert list(result) == ["y"]
        np.testing.assert_array_equal(result["y"], (x + 1) * 2)
        np.testing.assert_array_equal(double.batches[0]["IN"], x + 1)
        assert add1.threads == ["add1:1#0"] and double.threads == ["double:1#0"]
        for model in ("add1", "double"):  # each step counts as a request of its model
            statistics = repo.resolve(model, "").statistics
            assert statistics.success.count == 1 and statistics.inference_count == 3
        assert ensemble.inflight() == 0 and ensemble.queued() == 0
        await repo.stop()

    run(scenario())


def test_the_two_middle_steps_of_a_diamond_run_at_the_same_time() -> None:
    async def scenario() -> None:
        # Each middle model waits on the barrier inside its run: only both running at once lets either finish.
        barrier = threading.Barrier(2, timeout=WAIT)
        left, right = Compute(times(2), barrier.wait), Compute(times(3), barrier.wait)
        repo = Repository(served("pre", Compute(add(1))), served("left", left), served("right", right),
                          served("sum", Compute(add_inputs), io=BINARY))
        plan = plan_of(DIAMOND)
        plan.check_models(repo.resolve)
        ensemble = EnsembleScheduler("diamond:1", plan, repo.acquire)
        x = rows_of(2)
        result = await ensemble.submit({"x": x}, ["y"], 1)
        np.testing.assert_array_equal(result["y"], (x + 1) * 2 + (x + 1) * 3)
        assert not barrier.broken
        assert left.threads == ["left:1#0"] and right.threads == ["right:1#0"]
        await repo.stop()

    run(scenario())


def test_parallel_steps_of_a_lone_request_are_not_lone_requests() -> None:
    """A request alone in the server may run on the loop (core/loop_gate.py); two steps running at once are
    two requests' work, and on the loop one would wait for the other."""
    async def scenario() -> None:
        in_flight = InFlight()
        in_flight.requests = 1  # the ensemble's request, as its front-end counts it
        barrier = threading.Barrier(2, timeout=WAIT)

        def slow_meeting() -> None:  # slower than any handoff, within the lone budget
            time.sleep(0.001)
            barrier.wait()

        left, right = Compute(times(2), slow_meeting), Compute(times(3), slow_meeting)
        repo = Repository(*(served(name, model, in_flight=in_flight) for name, model in (
            ("pre", Compute(add(1))), ("left", left), ("right", right))),
            served("sum", Compute(add_inputs), io=BINARY, in_flight=in_flight))
        plan = plan_of(DIAMOND)
        plan.check_models(repo.resolve)
        ensemble = EnsembleScheduler("diamond:1", plan, repo.acquire, in_flight)
        for tag in range(3):  # the first measures each step's execution, the others could take the loop
            x = rows_of(tag)
            result = await ensemble.submit({"x": x}, ["y"], 1)
            np.testing.assert_array_equal(result["y"], (x + 1) * 2 + (x + 1) * 3)
        assert not barrier.broken and in_flight.parallel_steps == 0
        assert left.threads == ["left:1#0"] * 3 and right.threads == ["right:1#0"] * 3
        await repo.stop()

    run(scenario())


def test_only_the_steps_the_requested_outputs_need_run() -> None:
    async def scenario() -> None:
        add1, side = Compute(add(1)), Compute(times(5))
        config = ensemble_config(
            "two", ["x"], ["y", "z"],
            step("add1", {"IN": "x"}, {"OUT": "y"}),
            step("side", {"IN": "y"}, {"OUT": "z"}),
        )
        repo = Repository(served("add1", add1), served("side", side))
        ensemble = EnsembleScheduler("two:1", plan_of(config), repo.acquire)
        x = rows_of(3)
        only_y = await ensemble.submit({"x": x}, ["y"], 1)
        assert list(only_y) == ["y"] and side.batches == []
        both = await ensemble.submit({"x": x}, ["z", "y"], 1)
        assert list(both) == ["z", "y"]  # in the requested order
        np.testing.assert_array_equal(both["z"], (x + 1) * 5)
        assert len(add1.batches) == 2 and len(side.batches) == 1
        await repo.stop()

    run(scenario())


def test_outputs_pass_between_steps_and_out_without_copies() -> None:
    async def scenario() -> None:
        add1, identity = Compute(add(1)), Compute(lambda i: {"OUT": i["IN"]})
        config = ensemble_config(
            "pass", ["x"], ["y"],
            step("add1", {"IN": "x"}, {"OUT": "t"}),
            step("identity", {"IN": "t"}, {"OUT": "y"}),
        )
        repo = Repository(served("add1", add1), served("identity", identity))
        ensemble = EnsembleScheduler("pass:1", plan_of(config), repo.acquire)
        x = rows_of(4)
        result = await ensemble.submit({"x": x}, ["y"], 1)
        produced = add1.returned[0]["OUT"]
        assert identity.batches[0]["IN"] is produced
        assert np.shares_memory(result["y"], produced)
        assert add1.batches[0]["IN"] is x
        await repo.stop()

    run(scenario())


def test_requests_of_concurrent_ensemble_calls_batch_in_the_composing_models() -> None:
    async def scenario() -> None:
        # A batch goes as soon as it is full (4 rows); a long queue delay makes it wait for every caller.
        batching = "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 5000000 }"
        add1, double = Compute(add(1)), Compute(times(2))
        repo = Repository(served("add1", add1, batching), served("double", double, batching))
        ensemble = EnsembleScheduler("chain:1", plan_of(CHAIN), repo.acquire)
        inputs = [rows_of(tag) for tag in range(4)]
        results = await asyncio.gather(*(ensemble.submit({"x": x}, ["y"], 1) for x in inputs))
        for x, result in zip(inputs, results):
            np.testing.assert_array_equal(result["y"], (x + 1) * 2)  # each caller gets its own rows
        assert add1.sizes == [4] and double.sizes == [4]
        await repo.stop()

    run(scenario())


def test_each_step_resolves_its_model_when_it_runs() -> None:
    async def scenario() -> None:
        repo = Repository(served("add1", Compute(add(1))), served("double", Compute(times(2))))
        config = ensemble_config(
            "pinned", ["x"], ["y"],
            step("add1", {"IN": "x"}, {"OUT": "t"}),
            step("double", {"IN": "t"}, {"OUT": "y"}, version=1),
        )
        ensemble = EnsembleScheduler("pinned:1", plan_of(config), repo.acquire)
        x = rows_of(5)
        first = await ensemble.submit({"x": x}, ["y"], 1)
        np.testing.assert_array_equal(first["y"], (x + 1) * 2)
        repo.put(served("add1", Compute(add(100))))  # a reload of the same version
        repo.put(served("add1", Compute(add(1000)), version=2))  # and a newer version: the latest
        repo.put(served("double", Compute(times(3)), version=2))  # not the pinned version 1
        second = await ensemble.submit({"x": x}, ["y"], 1)
        np.testing.assert_array_equal(second["y"], (x + 1000) * 2)
        await repo.stop()

    run(scenario())


def test_a_missing_model_or_a_misfit_tensor_fails_the_request_naming_the_step() -> None:
    async def scenario() -> None:
        narrow = f"input [ {tensor('IN', '[ 3 ]')} ] output [ {tensor('OUT', '[ 3 ]')} ]"
        double = Compute(times(2))
        repo = Repository(served("add1", Compute(add(1))), served("double", double, io=narrow))
        ensemble = EnsembleScheduler("chain:1", plan_of(CHAIN), repo.acquire)  # check_models would refuse it
        error = await rejected_async(ensemble.submit({"x": rows_of(1)}, ["y"], 1), ErrorKind.INVALID_INPUT)
        assert error.message == (
            "ensemble 'chain' step 2 (model 'double'): input 'IN' has shape [1,4], but model 'double' expects [-1,3]"
        )
        assert double.batches == [] and repo.resolve("double", "").statistics.fail.count == 1
        retired = repo.models.pop("double")[1]
        error = await rejected_async(ensemble.submit({"x": rows_of(1)}, ["y"], 1), ErrorKind.UNAVAILABLE)
        assert error.message == (
            "ensemble 'chain' step 2 (model 'double'): Request for unknown model: 'double' is not found"
        )
        repo.retired.append(retired)
        await repo.stop()

    run(scenario())


@pytest.mark.parametrize(
    ("failure", "kind", "message"),
    [
        (RuntimeError("boom"), ErrorKind.INTERNAL,
         "ensemble 'diamond' step 2 (model 'left'): model 'left' failed: boom"),
        (invalid("values out of range"), ErrorKind.INVALID_INPUT,
         "ensemble 'diamond' step 2 (model 'left'): values out of range"),
    ],
)
def test_a_failing_step_fails_the_request_naming_it_and_cancels_the_others(
    failure: Exception, kind: ErrorKind, message: str
) -> None:
    async def scenario() -> None:
        def fail(_: Arrays) -> Arrays:
            raise failure

        left_gate, right_gate = threading.Event(), threading.Event()
        right = Compute(times(3), gate_of(right_gate))
        repo = Repository(served("pre", Compute(add(1))), served("left", Compute(fail, gate_of(left_gate))),
                          served("right", right), served("sum", Compute(add_inputs), io=BINARY))
        right_scheduler = repo.resolve("right", "").scheduler
        ensemble = EnsembleScheduler("diamond:1", plan_of(DIAMOND), repo.acquire)
        # Another request holds right's only instance, so the ensemble's right step waits in right's queue.
        holder = asyncio.ensure_future(right_scheduler.submit({"IN": rows_of(9)}, ["OUT"], 1))
        await until(lambda: len(right.batches) == 1, "the holder to run")
        call = asyncio.ensure_future(ensemble.submit({"x": rows_of(6)}, ["y"], 1))
        await until(lambda: right_scheduler.queued() == 1, "the right step to queue")
        left_gate.set()
        error = await rejected_async(call, kind)
        assert error.message == message
        assert right_scheduler.queued() == 0  # withdrawn before it ran
        right_gate.set()
        await holder
        assert len(right.batches) == 1 and right_scheduler.inflight() == 0
        assert repo.resolve("left", "").statistics.fail.count == 1
        assert repo.resolve("sum", "").statistics.success.count + repo.resolve("sum", "").statistics.fail.count == 0
        assert ensemble.inflight() == 0
        await repo.stop()

    run(scenario())


def test_a_caller_that_leaves_cancels_the_steps_in_flight() -> None:
    async def scenario() -> None:
        gate = threading.Event()
        add1, double = Compute(add(1), gate_of(gate)), Compute(times(2))
        repo = Repository(served("add1", add1), served("double", double))
        ensemble = EnsembleScheduler("chain:1", plan_of(CHAIN), repo.acquire)
        add1_scheduler = repo.resolve("add1", "").scheduler
        call = asyncio.ensure_future(ensemble.submit({"x": rows_of(7)}, ["y"], 1))
        await until(lambda: len(add1.batches) == 1, "the first step to run")
        call.cancel()
        gone, _ = await asyncio.wait([call], timeout=1)  # without waiting for the step's model to finish
        assert gone and call.cancelled()
        assert add1_scheduler.inflight() == 0 and ensemble.inflight() == 0
        gate.set()
        await repo.stop()
        assert double.batches == []  # the next step never started

    run(scenario())


def test_priority_and_timeout_reach_each_step() -> None:
    async def scenario() -> None:
        gate = threading.Event()
        add1 = Compute(add(1), gate_of(gate))
        config = """max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 2
            default_queue_policy { allow_timeout_override: true } }"""
        repo = Repository(served("add1", add1, config), served("double", Compute(times(2))))
        ensemble = EnsembleScheduler("chain:1", plan_of(CHAIN), repo.acquire)
        error = await rejected_async(ensemble.submit({"x": rows_of(1)}, ["y"], 1, priority=3), ErrorKind.INVALID_INPUT)
        assert error.message.startswith("ensemble 'chain' step 1 (model 'add1'): request priority 3")
        holder = asyncio.ensure_future(ensemble.submit({"x": rows_of(2)}, ["y"], 1, priority=1))
        await until(lambda: len(add1.batches) == 1, "the holder to run")
        error = await rejected_async(ensemble.submit({"x": rows_of(3)}, ["y"], 1, timeout_us=20_000), ErrorKind.TIMEOUT)
        assert error.message.startswith("ensemble 'chain' step 1 (model 'add1'): ")
        gate.set()
        await holder
        await repo.stop()

    run(scenario())


def test_stop_refuses_new_requests_and_waits_for_those_in_flight() -> None:
    async def scenario() -> None:
        gate = threading.Event()
        add1 = Compute(add(1), gate_of(gate))
        repo = Repository(served("add1", add1), served("double", Compute(times(2))))
        ensemble = EnsembleScheduler("chain:1", plan_of(CHAIN), repo.acquire)
        call = asyncio.ensure_future(ensemble.submit({"x": rows_of(1)}, ["y"], 1))
        await until(lambda: len(add1.batches) == 1, "the request to run")
        stopping = asyncio.ensure_future(ensemble.stop())
        await asyncio.sleep(0.01)
        assert not stopping.done() and ensemble.inflight() == 1
        error = await rejected_async(ensemble.submit({"x": rows_of(2)}, ["y"], 1), ErrorKind.UNAVAILABLE)
        assert "chain:1 is stopping" in error.message
        gate.set()
        await asyncio.wait_for(stopping, WAIT)
        np.testing.assert_array_equal((await call)["y"], (rows_of(1) + 1) * 2)
        await ensemble.stop()  # again, with nothing in flight: returns at once
        await repo.stop()

    run(scenario())


# --------------------------------------------------------------------------- checks from the config alone


def x_to_y(*steps: str, inputs: Sequence[str] = ("x",), outputs: Sequence[str] = ("y",)) -> str:
    """An ensemble 'e' of `steps` from inputs to outputs."""
    return ensemble_config("e", inputs, outputs, *steps)


ONE_STEP = step("m", {"IN": "x"}, {"OUT": "y"})
E1 = "ensemble 'e' step 1 (model 'm')"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (x_to_y(ONE_STEP).replace(f"step [ {ONE_STEP} ]", ""),
         "ensemble 'e': ensemble_scheduling must list at least one step"),
        (x_to_y(ONE_STEP).replace('"ensemble"', '"onnx"'), "ensemble 'e': platform must be 'ensemble', got 'onnx'"),
        (x_to_y(step("", {"IN": "x"}, {"OUT": "y"})), "ensemble 'e' step 1 has no model_name"),
        (x_to_y(step("m", {"IN": "x"}, {"OUT": "y"}, version=-2)),
         "ensemble 'e' step 1: model_version must be -1 (the latest) or a version, got -2"),
        (x_to_y(step("m", {}, {"OUT": "y"})), f"{E1} has no input_map"),
        (x_to_y(step("m", {"IN": "x"}, {})), f"{E1} has no output_map"),
        (x_to_y(step("m", {"IN": "x"}, {"OUT": "t"}), step("n", {"IN": "tt"}, {"OUT": "y"})),
         "ensemble 'e' step 2 (model 'n') reads tensor 'tt', which is neither an ensemble input nor written by "
         "any step"),
        (x_to_y(ONE_STEP, step("n", {"IN": "x"}, {"OUT": "y"})),
         "ensemble 'e' step 2 (model 'n') writes tensor 'y', which step 1 (model 'm') writes too"),
        (x_to_y(step("m", {"IN": "x"}, {"OUT": "y", "OUT2": "y"})), f"{E1} writes tensor 'y' from two of its outputs"),
        (x_to_y(step("m", {"IN": "x"}, {"OUT": "y", "OUT2": "x"})),
         f"{E1} writes tensor 'x', which is an ensemble input"),
        (x_to_y(ONE_STEP, outputs=["y", "z"]), "ensemble 'e': output 'z' is not written by any step"),
        (x_to_y(ONE_STEP, inputs=["x", "w"]), "ensemble 'e': input 'w' is not read by any step"),
        (x_to_y(step("m", {"IN": "x"}, {"OUT": "y", "OUT2": "spare"})),
         f"{E1} writes tensor 'spare', which no step reads and is not an ensemble output"),
        (x_to_y(step("m", {"IN": "x", "IN2": "c"}, {"OUT": "a"}), step("n", {"IN": "a"}, {"OUT": "b"}, version=3),
                step("o", {"IN": "b"}, {"OUT": "c"}), step("p", {"IN": "a"}, {"OUT": "y"})),
         "ensemble 'e': steps form a cycle: step 1 (model 'm') -> step 2 (model 'n' version 3) -> step 3 (model 'o') "
         "-> step 1 (model 'm')"),
        (x_to_y(step("m", {"IN": "x", "IN2": "y"}, {"OUT": "y"})),
         "ensemble 'e': steps form a cycle: step 1 (model 'm') -> step 1 (model 'm')"),
    ],
)
def test_a_config_with_a_broken_dag_is_rejected_naming_the_step_and_tensor(config: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_of(config)
    assert str(info.value) == message


def test_a_plan_knows_its_steps_and_composing_models() -> None:
    plan = plan_of(ensemble_config(
        "e", ["x"], ["y", "z"],
        step("m", {"IN": "x"}, {"OUT": "a"}, version=0),  # an unset version is the latest
        step("n", {"IN": "a"}, {"OUT": "y"}, version=2),
        step("m", {"IN": "a"}, {"OUT": "z"}),
    ))
    assert plan.composing_models() == [("m", LATEST), ("n", 2)]
    assert plan.needs == (frozenset(), frozenset({0}), frozenset({0}))
    assert plan.steps_for(["y"]) == {0, 1} and plan.steps_for(["z"]) == {0, 2}


# --------------------------------------------------------------------------- checks against the composing models


def diamond_repo(sum_io: str = BINARY, left_io: str = UNARY, left_config: str = "") -> Repository:
    return Repository(served("pre", Compute(add(1))), served("left", Compute(times(2)), left_config, left_io),
                      served("right", Compute(times(3))), served("sum", Compute(add_inputs), io=sum_io))


def test_a_step_whose_model_does_not_batch_fits_a_batching_ensemble() -> None:
    # As Triton (qa/ensemble_models/batch_to_nobatch_*): such a step takes the ensemble's batch whole.
    async def scenario() -> None:
        plan_of(DIAMOND).check_models(diamond_repo(left_config="max_batch_size: 0").resolve)

    run(scenario())


@pytest.mark.parametrize(
    ("repo_args", "message"),
    [
        ({"sum_io": f"input [ {tensor('A')}, {tensor('C')} ] output [ {tensor('OUT')} ]"},
         "ensemble 'diamond' step 4 (model 'sum') maps input 'B', but the model's inputs are 'A', 'C'"),
        ({"left_io": f"input [ {tensor('IN')} ] output [ {tensor('RESULT')} ]"},
         "ensemble 'diamond' step 2 (model 'left') maps output 'OUT', but the model's outputs are 'RESULT'"),
        ({"sum_io": f"input [ {tensor('A')}, {tensor('B')}, {tensor('C')} ] output [ {tensor('OUT')} ]"},
         "ensemble 'diamond' step 4 (model 'sum'): input_map leaves the model's required input(s) ['C'] unmapped"),
        ({"left_io": f"input [ {tensor('IN', dtype='TYPE_FP64')} ] output [ {tensor('OUT')} ]"},
         "ensemble 'diamond': tensor 'a' is FP32 [-1,4] as output 'OUT' of step 1 (model 'pre'), "
         "but FP64 [-1,4] as input 'IN' of step 2 (model 'left')"),
        ({"left_io": f"input [ {tensor('IN')} ] output [ {tensor('OUT', dims='[ 5 ]')} ]"},
         "ensemble 'diamond': tensor 'b' is FP32 [-1,5] as output 'OUT' of step 2 (model 'left'), "
         "but FP32 [-1,4] as input 'A' of step 4 (model 'sum')"),
        ({"left_config": "max_batch_size: 4"},
         "ensemble 'diamond' step 2 (model 'left'): the ensemble's max_batch_size 8 is above the model's "
         "max_batch_size 4"),
    ],
)
def test_steps_that_do_not_fit_their_models_are_rejected(repo_args: dict[str, str], message: str) -> None:
    async def scenario() -> None:
        repo = diamond_repo(**repo_args)
        with pytest.raises(ConfigError) as info:
            plan_of(DIAMOND).check_models(repo.resolve)
        assert str(info.value) == message
        await repo.stop()

    run(scenario())


def test_checks_accept_variable_dims_and_optional_inputs_and_report_a_missing_model() -> None:
    async def scenario() -> None:
        sum_io = f"input [ {tensor('A', '[ -1 ]')}, {tensor('B')}, {tensor('C')[:-1]} optional: true }} ] " \
                 f"output [ {tensor('OUT', '[ -1 ]')} ]"
        repo = diamond_repo(sum_io=sum_io)
        plan_of(DIAMOND).check_models(repo.resolve)
        del repo.models["right"]
        with pytest.raises(ConfigError) as info:
            plan_of(DIAMOND).check_models(repo.resolve)
        assert str(info.value) == (
            "ensemble 'diamond' step 3 (model 'right'): Request for unknown model: 'right' is not found"
        )
        await repo.stop()

    run(scenario())
