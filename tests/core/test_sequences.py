"""The sequence batcher's own logic (core/sequences.py): order within a sequence, slots and backlog, idle
release on a hand-moved clock (tests/fakes.py ManualClock), control tensors and implicit state; the model is
an accumulator in the test (its submit), so every answer is exact."""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Any

import numpy as np
import pytest

from modelhost.config.completion import complete_config
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.sequence_controls import SequenceFlags, sequence_flags
from modelhost.core.sequence_state import ImplicitState
from modelhost.core.sequences import SequenceBatcher
from modelhost.errors import ErrorKind, ModelhostError
from tests.core.scheduler_harness import gated, rows_of, serving
from tests.fakes import Echo, ManualClock
from tests.helpers import until

CONFIG = """
name: "acc"
max_batch_size: %d
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "max_sequence_backlog" value: { string_value: "%d" } }
sequence_batching {
  max_sequence_idle_microseconds: %d
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
"""


class Accumulator:
    """The model: y = S_IN + x, state S_OUT = y. Each call can be held until the test lets it go."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.hold = False
        self.release = asyncio.Event()
        self.running: set[int] = set()  # the sequences with a call in progress
        self.instances: list[int] = []  # the instance each call was pinned to
        self.rows: list[int] = []  # the batch row each call was given (a direct slot)

    async def submit(self, feeds: dict[str, np.ndarray], names: list[str], instance: int = -1,
                     row: int = -1) -> dict[str, np.ndarray]:
        self.instances.append(instance)
        self.rows.append(row)
        sequence = int(feeds["CORRID"][0, 0])
        assert sequence not in self.running, "two requests of one sequence at once"
        self.running.add(sequence)
        self.calls.append(dict(feeds))
        try:
            if self.hold:
                await self.release.wait()
            y = feeds["S_IN"] + feeds["x"]
            return {"y": y, "S_OUT": y}
        finally:
            self.running.discard(sequence)


def batcher(max_batch_size: int = 2, backlog: int = 10, idle_us: int = 0, clock: Any = None,
            instances: int = 1) -> SequenceBatcher:
    config = parse_config(CONFIG % (max_batch_size, backlog, idle_us))
    return SequenceBatcher("acc", "acc:1", config, instances, clock or ManualClock())


async def send(sequences: SequenceBatcher, model: Accumulator, value: float, sequence_id: int | str,
               start: bool = False, end: bool = False) -> float:
    feeds = {"x": np.array([[value]], np.float32)}
    results = await sequences.run(SequenceFlags(sequence_id, start, end), feeds, ["y"], 1, model.submit)
    assert set(results) == {"y"}  # the state output is the server's
    return float(results["y"][0, 0])


def test_state_controls_and_a_second_start() -> None:
    async def scenario() -> None:
        sequences, model = batcher(), Accumulator()
        assert await send(sequences, model, 1, 7, start=True) == 1
        assert await send(sequences, model, 2, 7) == 3
        first, second = model.calls
        assert first["START"].tolist() == [[1.0]] and second["START"].tolist() == [[0.0]]
        assert first["READY"].dtype == np.bool_ and first["READY"].tolist() == [[True]]
        assert first["CORRID"].dtype == np.int32 and first["CORRID"].tolist() == [[7]]
        assert first["S_IN"].tolist() == [[0.0]]
        assert await send(sequences, model, 10, 7, start=True) == 10  # begun anew: the state is the initial one
        assert await send(sequences, model, 1, 7, end=True) == 11
        assert sequences.open_sequences() == 0 and sequences.free_slots() == 2

    asyncio.run(scenario())


def test_requests_of_a_sequence_run_one_at_a_time_in_order() -> None:
    async def scenario() -> None:
        sequences, model = batcher(), Accumulator()
        model.hold = True
        tasks = [asyncio.ensure_future(send(sequences, model, value, 5, start=value == 1)) for value in (1, 2, 3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(model.calls) == 1  # the others wait for it
        model.release.set()
        assert await asyncio.gather(*tasks) == [1, 3, 6]

    asyncio.run(scenario())


def test_a_start_queued_behind_the_end_of_its_id_opens_it_again() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        sequences, model = batcher(clock=clock), Accumulator()
        model.hold = True
        ending = asyncio.ensure_future(send(sequences, model, 1, 9, start=True, end=True))
        again = asyncio.ensure_future(send(sequences, model, 5, 9, start=True))
        late = asyncio.ensure_future(send(sequences, model, 1, 9))
        await asyncio.sleep(0)
        model.release.set()
        assert await ending == 1 and await again == 5 and await late == 6
        assert sequences.open_sequences() == 1 and sequences.free_slots() == 1
        clock.advance(1.1)  # the default idle timeout
        assert sequences.open_sequences() == 0 and sequences.free_slots() == 2

    asyncio.run(scenario())


def test_close_all_lets_a_reloaded_version_stop() -> None:
    async def scenario() -> None:
        sequences, model = batcher(), Accumulator()
        await send(sequences, model, 1, 1, start=True)
        await send(sequences, model, 1, 2, start=True)
        waiting = asyncio.ensure_future(sequences.finished())
        await asyncio.sleep(0)
        assert not waiting.done()
        sequences.close_all()
        await asyncio.wait_for(waiting, 1)
        assert sequences.free_slots() == 2
        with pytest.raises(ModelhostError, match="must specify the START flag"):
            await send(sequences, model, 1, 1)

    asyncio.run(scenario())


def test_a_full_batcher_backlogs_new_sequences_then_refuses_them() -> None:
    async def scenario() -> None:
        sequences, model = batcher(max_batch_size=1, backlog=1), Accumulator()
        assert await send(sequences, model, 1, 1, start=True) == 1  # the only slot
        waiting = asyncio.ensure_future(send(sequences, model, 5, 2, start=True))
        await asyncio.sleep(0)
        assert not waiting.done() and sequences.free_slots() == 0
        with pytest.raises(ModelhostError) as refused:
            await send(sequences, model, 1, 3, start=True)
        assert refused.value.kind is ErrorKind.OVERLOADED
        assert await send(sequences, model, 1, 1, end=True) == 2  # frees the slot for the oldest waiting
        assert await waiting == 5

    asyncio.run(scenario())


def test_idle_sequences_are_released_and_their_slot_goes_on() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        sequences, model = batcher(max_batch_size=1, idle_us=500_000, clock=clock), Accumulator()
        assert await send(sequences, model, 1, 1, start=True) == 1
        waiting = asyncio.ensure_future(send(sequences, model, 5, 2, start=True))
        await asyncio.sleep(0)
        clock.advance(0.4)
        await asyncio.sleep(0)
        assert not waiting.done()
        clock.advance(0.2)  # sequence 1 idle for 0.6 s > 0.5 s
        assert await waiting == 5 and sequences.idled_out == 1
        with pytest.raises(ModelhostError, match="must specify the START flag"):
            await send(sequences, model, 1, 1)
        clock.advance(0.6)
        assert sequences.open_sequences() == 0 and sequences.free_slots() == 1

    asyncio.run(scenario())


def test_each_sequence_idles_out_at_its_own_time_whatever_the_order_they_opened_in() -> None:
    """The sweep releases the sequences in order of their last use and stops at the first not yet due: one used
    again since goes behind the others, and one in use is passed over, not taken for the first not due."""
    async def scenario() -> None:
        clock = ManualClock()
        sequences, model = batcher(max_batch_size=4, idle_us=500_000, clock=clock), Accumulator()
        for sequence_id in (1, 2, 3):
            await send(sequences, model, 1, sequence_id, start=True)
            clock.advance(0.1)
        await send(sequences, model, 1, 1)  # sequence 1 used at 0.3: due at 0.8, after 2 (0.6) and 3 (0.7)
        await send(sequences, model, 1, 4, start=True)  # 4 opened at 0.3, due at 0.8
        model.hold = True
        busy = asyncio.ensure_future(send(sequences, model, 1, 2))  # 2 in use from 0.3 until let go
        await asyncio.sleep(0)
        clock.advance(0.45)  # 0.75: 3 is due; 2 is in use
        assert sequences.idled_out == 1 and not sequences.is_open(3)
        assert sequences.is_open(1) and sequences.is_open(2) and sequences.is_open(4)
        clock.advance(0.1)  # 0.85: 1 and 4 are due
        assert sequences.idled_out == 3 and sequences.open_sequences() == 1
        model.release.set()
        await busy
        clock.advance(0.45)
        assert sequences.is_open(2)  # its last use ended at 0.85
        clock.advance(0.1)
        assert sequences.idled_out == 4 and sequences.open_sequences() == 0

    asyncio.run(scenario())


def test_a_request_that_leaves_while_waiting_for_a_slot_takes_none() -> None:
    async def scenario() -> None:
        sequences, model = batcher(max_batch_size=1), Accumulator()
        await send(sequences, model, 1, 1, start=True)
        leaving = asyncio.ensure_future(send(sequences, model, 1, 2, start=True))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        await send(sequences, model, 1, 1, end=True)
        assert sequences.free_slots() == 1

    asyncio.run(scenario())


def test_with_several_instances_a_sequence_keeps_to_its_slots_instance() -> None:
    async def scenario() -> None:
        sequences, model = batcher(max_batch_size=2, instances=2), Accumulator()
        for step in range(3):
            for sequence_id in (1, 2, 3):
                await send(sequences, model, 1, sequence_id, start=step == 0)
        # The instances take turns for new sequences: 1 and 3 on instance 0, 2 on instance 1.
        assert model.instances == [0, 1, 0] * 3
        assert model.rows == [0, 0, 1] * 3  # direct: each at its slot's row of its instance's batches
        single, alone = batcher(max_batch_size=2), Accumulator()
        await send(single, alone, 1, 1, start=True)
        await send(single, alone, 1, 2, start=True)
        assert alone.instances == [0, 0] and alone.rows == [0, 1]  # direct: pinned to its row even alone
        config = CONFIG.replace("sequence_batching {", "sequence_batching { oldest { }") % (2, 10, 0)
        oldest = SequenceBatcher("acc", "acc:1", parse_config(config), 1, ManualClock())
        await send(oldest, alone, 1, 1, start=True)
        assert alone.instances[-1] == -1 and alone.rows[-1] == -1  # oldest, one instance: nothing to pin

    asyncio.run(scenario())


def test_slots_are_per_instance_and_ids_checked() -> None:
    assert batcher(max_batch_size=4, instances=3).slots == 12
    assert batcher(max_batch_size=0).slots == 1

    async def scenario() -> None:
        sequences, model = batcher(), Accumulator()
        with pytest.raises(ModelhostError, match="does not fit this model's CONTROL_SEQUENCE_CORRID"):
            await send(sequences, model, 1, 2**31, start=True)
        with pytest.raises(ModelhostError, match="must specify batch-size 1"):
            await sequences.run(SequenceFlags(3, True, False), {"x": np.zeros((2, 1), np.float32)}, ["y"], 2,
                                model.submit)
        assert sequences.open_sequences() == 0  # refused before it opened a sequence

    asyncio.run(scenario())


def test_sequence_parameters_are_checked() -> None:
    assert sequence_flags({}) is None
    assert sequence_flags({"sequence_id": 2**64 - 1, "sequence_start": True}) == SequenceFlags(2**64 - 1, True, False)
    for parameters, problem in (({"sequence_id": 2**64}, "between 0 and 2"),
                                ({"sequence_id": 1.5}, "an integer or a string"),
                                ({"sequence_id": "x" * 300}, "more than 256 bytes"),
                                ({"sequence_id": 1, "sequence_end": 1}, "'sequence_end' must be a boolean")):
        with pytest.raises(ModelhostError, match=re.escape(problem)):
            sequence_flags(parameters)


STATE = 'output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ]'


@pytest.mark.parametrize(("old", "new", "problem"), [
    ("bool_false_true: [ false, true ]", "bool_false_true: [ false, true ] fp32_false_true: [ 0, 1 ]",
     "give exactly one of"),
    (STATE, STATE + ' initial_state [ { name: "f" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "initial_state needs zero_data or data_file"),
    (STATE, STATE + ' initial_state [ { name: "f" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } ]',
     "initial_state must have the state's data_type"),
    ("data_type: TYPE_INT32 } ] }", "data_type: TYPE_FP32 } ] }", "CONTROL_SEQUENCE_CORRID data_type must be"),
    ("sequence_batching {", "sequence_batching { iterative_sequence: true", "iterative_sequence is not supported"),
])
def test_config_errors(old: str, new: str, problem: str) -> None:
    text = CONFIG % (2, 10, 0)
    assert old in text
    with pytest.raises(ConfigError, match=re.escape(problem)):
        SequenceBatcher("acc", "acc:1", parse_config(text.replace(old, new)), 1, ManualClock())


@pytest.mark.parametrize("listed", ["input", "output"])
def test_a_config_that_lists_a_control_as_an_input_or_output_is_refused(listed: str) -> None:
    config = parse_config(CONFIG % (2, 10, 0))
    getattr(config, listed).add(name="START", data_type=config.input[0].data_type, dims=[1])
    with pytest.raises(ConfigError, match="'START' is a sequence_batching control or state tensor"):
        complete_config(config, [], [], "1/model.onnx", 0)


HARNESS_CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
sequence_batching {
  direct { }
  control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
}
"""


def test_over_the_scheduler_a_batch_holds_one_request_per_sequence() -> None:
    """A real Scheduler (tests/core/scheduler_harness.py) behind the batcher: while the instance is held, requests
    of three sequences queue; the next batch takes one of each, the sequence's second request the batch after."""
    async def scenario() -> None:
        model = gated()
        async with serving(HARNESS_CONFIG, model) as harness:
            sequences = SequenceBatcher("m", "m:1", parse_config(HARNESS_CONFIG), 1)

            def send(tag: int, sequence_id: int, start: bool = False) -> asyncio.Task[Any]:
                feeds = {"INPUT0": rows_of(tag)}
                return asyncio.ensure_future(sequences.run(SequenceFlags(sequence_id, start, False), feeds,
                                                           ["OUTPUT0"], 1, partial(harness.scheduler.submit, rows=1)))

            first = send(1, 1, start=True)
            await until(lambda: model.started == 1, what="the first request to run")
            later = [send(2, 1), send(3, 2, start=True), send(4, 3, start=True), send(5, 2)]
            await until(lambda: harness.scheduler.queued() == 2, what="one request of sequences 2 and 3 to queue")
            model.open()
            answers = await asyncio.gather(first, *later)
        assert [int(a["OUTPUT0"][0, 0]) // 1000 for a in answers] == [1, 2, 3, 4, 5]
        batches = [sorted(int(i) for i in batch["CORRID"].ravel()) for batch in model.batches]
        assert batches[0] == [1]
        for batch in batches:
            assert len(batch) == len(set(batch)), batches  # never two requests of one sequence in a batch
        assert sorted(i for batch in batches for i in batch) == [1, 1, 2, 2, 3]
        assert len(model.batches) < 5  # sequences batched together

    asyncio.run(scenario())


def test_over_the_scheduler_a_sequence_runs_on_its_instance_alone() -> None:
    async def scenario() -> None:
        first, second = Echo(), Echo()
        async with serving(HARNESS_CONFIG, first, second) as harness:
            sequences = SequenceBatcher("m", "m:1", parse_config(HARNESS_CONFIG), 2)

            async def run(sequence_id: int) -> None:
                for step in range(6):
                    feeds = {"INPUT0": rows_of(sequence_id)}
                    await sequences.run(SequenceFlags(sequence_id, step == 0, step == 5), feeds, ["OUTPUT0"], 1,
                                        partial(harness.scheduler.submit, rows=1))

            await asyncio.gather(*(run(sequence_id) for sequence_id in (1, 2, 3, 4)))
        seen = [{int(i) for batch in model.batches for i in batch["CORRID"].ravel()} for model in (first, second)]
        assert seen == [{1, 3}, {2, 4}]

    asyncio.run(scenario())


def test_direct_queue_delay_counts_only_with_a_minimum_slot_utilization() -> None:
    def policy(direct: str) -> SchedulingPolicy:
        return SchedulingPolicy.from_config(parse_config(CONFIG.replace("sequence_batching {", f"sequence_batching {{ "
                                                                        f"direct {{ {direct} }}") % (4, 10, 0)))

    without = policy("max_queue_delay_microseconds: 3000")
    assert (without.max_queue_delay_s, without.preferred_batch_sizes) == (0.0, ())  # Triton ignores the delay
    half = policy("max_queue_delay_microseconds: 3000 minimum_slot_utilization: 0.5")
    assert (half.max_queue_delay_s, half.preferred_batch_sizes) == (0.003, (4, 3, 2))  # 2 of 4 slots or more
    with pytest.raises(ConfigError, match="minimum_slot_utilization must be between 0 and 1"):
        policy("minimum_slot_utilization: 1.5")


def file_state(data_file: str) -> Any:
    return parse_config((CONFIG % (2, 10, 0)).replace(
        STATE, STATE + f' initial_state [ {{ name: "f" data_type: TYPE_FP32 dims: [ 1 ] data_file: "{data_file}" }} ]'))


def test_initial_state_from_a_data_file(tmp_path: Any) -> None:
    folder = tmp_path / "model" / "initial_state"
    folder.mkdir(parents=True)
    (folder / "init").write_bytes(np.array([2.5], "<f4").tobytes() + b"extra bytes are ignored, as in Triton")

    async def scenario() -> None:
        sequences = SequenceBatcher("acc", "acc:1", file_state("init"), 1, ManualClock(), model_dir=tmp_path / "model")
        model = Accumulator()
        assert await send(sequences, model, 1, 1, start=True) == 3.5
        assert await send(sequences, model, 1, 1) == 4.5
        assert await send(sequences, model, 1, 1, start=True) == 3.5  # a new start: the file's state again

    asyncio.run(scenario())


def test_an_initial_state_data_file_stays_in_the_models_initial_state_folder(tmp_path: Any) -> None:
    model_dir = tmp_path / "model"
    (model_dir / "initial_state").mkdir(parents=True)
    (tmp_path / "outside").write_bytes(b"\0" * 4)
    (model_dir / "config.pbtxt").write_bytes(b"\0" * 4)
    (model_dir / "initial_state" / "link").symlink_to(tmp_path / "outside")
    (model_dir / "initial_state" / "short").write_bytes(b"\0" * 2)
    for name, problem in (("../config.pbtxt", "must name a file inside initial_state/ of the model's directory"),
                          (str(tmp_path / "outside"), "must name a file inside initial_state/"),
                          ("link", "must name a file inside initial_state/"),
                          ("absent", "cannot read initial_state data_file initial_state/absent"),
                          ("short", "initial_state/short has 2 bytes; dims [1] of FP32 need 4")):
        with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
            SequenceBatcher("acc", "acc:1", file_state(name), 1, ManualClock(), model_dir=model_dir)
        assert str(tmp_path) not in str(caught.value).replace(f"'{tmp_path}/outside'", "")  # no server paths


def test_a_string_state_from_a_data_file(tmp_path: Any) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "words").write_bytes(b"\2\0\0\0hi\0\0\0\0")
    config = parse_config("""
        max_batch_size: 2
        sequence_batching { state [ { input_name: "S" output_name: "T" data_type: TYPE_STRING dims: [ 2 ]
          initial_state [ { name: "w" data_type: TYPE_STRING dims: [ 2 ] data_file: "words" } ] } ] }""")
    initial = ImplicitState(config, tmp_path).initial()["S"]
    assert initial.dtype == np.object_ and initial.tolist() == [[b"hi", b""]] and not initial.flags.writeable
    zeros = ImplicitState(parse_config(str(config).replace('data_file: "words"', "zero_data: true")))
    assert zeros.initial()["S"].tolist() == [[b"", b""]]


@pytest.mark.parametrize(("batching", "dims", "shape"), [(2, "[ -1 ]", (1, 1)), (0, "[ 3, -1 ]", (3, 1))])
def test_a_state_without_initial_state_starts_as_zeros_with_variable_dims_of_1(batching: int, dims: str,
                                                                              shape: tuple[int, ...]) -> None:
    # As Triton's sequence_state.cc (its QA's variable-shape implicit-state models start from one zero).
    config = parse_config(f"""
        max_batch_size: {batching}
        sequence_batching {{ state [ {{ input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: {dims} }} ] }}""")
    initial = ImplicitState(config).initial()["S"]
    assert initial.shape == shape and not initial.any()
