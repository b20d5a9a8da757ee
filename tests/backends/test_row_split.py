"""A large batch runs as parts on idle cores (backends/row_split.py), and the ONNX backend answers the same."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from modelhost.backends import row_split
from modelhost.backends.base import InstanceSettings
from modelhost.backends.onnx import OnnxBackend
from modelhost.backends.row_split import PART_MIN_NS, RowSplitter
from modelhost.config.pbtxt import parse_config
from modelhost.core.spare_cores import SpareCores
from modelhost.example_repository import RANK_FEATURES, write_example_repository

ROWS = 500
T = TypeVar("T")


class Recorded:
    """A run that takes PART_MIN_NS / 100 per row (so 500 rows are worth splitting) and notes each part."""

    def __init__(self, batch_major: bool = True, fail_on: int | None = None) -> None:
        self.parts: list[tuple[int, int]] = []  # (rows, thread)
        self.batch_major = batch_major
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        with self._lock:
            self.parts.append((len(x), threading.get_ident()))
        time.sleep(len(x) * PART_MIN_NS / 100 / 1e9)
        if self.fail_on is not None and self.fail_on in x[:, 0]:
            raise RuntimeError("a part failed")
        total = x.sum(axis=1, keepdims=True)
        return [x * 2, total if self.batch_major else total.sum(keepdims=True).reshape(1, 1)[:, 0]]


def rows() -> dict[str, np.ndarray]:
    return {"x": np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)}


def test_a_batch_runs_whole_until_its_time_is_known_then_in_parts_on_idle_cores() -> None:
    spare = SpareCores.alone(2)
    splitter, run = RowSplitter(spare, threads=1), Recorded()
    whole = splitter.run(run, rows())
    assert [n for n, _ in run.parts] == [ROWS]  # nothing known of its time yet
    run.parts.clear()
    spare.computing(1)  # as the instance thread counts itself
    parted = splitter.run(run, rows())
    assert sorted(n for n, _ in run.parts) == [ROWS // 2, ROWS // 2]
    assert len({thread for _, thread in run.parts}) == 2
    for a, b in zip(whole, parted, strict=True):
        np.testing.assert_array_equal(a, b)  # joined back in order
    assert spare.borrow(1) == 1  # the borrowed core was given back


class SlowToWake(SpareCores):
    """Its helpers start their part 2 ms after they are handed it."""

    def submit(self, work: Callable[[], T]) -> Future[T]:
        def late() -> T:
            time.sleep(0.002)
            return work()

        return super().submit(late)


def test_the_calling_thread_takes_more_rows_by_what_a_helper_takes_to_wake() -> None:
    spare = SlowToWake(2, memoryview(bytearray(4)).cast("i"), 0)
    spare.computing(1)
    splitter, run = RowSplitter(spare, threads=1), Recorded()
    splitter.run(run, rows())
    splitter.run(run, rows())  # equal parts: no wake-up measured yet
    run.parts.clear()
    caller = threading.get_ident()
    splitter.run(run, rows())
    mine = sum(n for n, thread in run.parts if thread == caller)
    assert sum(n for n, _ in run.parts) == ROWS
    assert ROWS // 2 < mine < ROWS  # about 2 ms worth of rows more, never all of them


def test_no_idle_core_no_parts() -> None:
    spare = SpareCores.alone(1)
    splitter, run = RowSplitter(spare, threads=1), Recorded()
    splitter.run(run, rows())
    spare.computing(1)
    splitter.run(run, rows())
    assert [n for n, _ in run.parts] == [ROWS, ROWS]


def test_outputs_that_are_not_batch_major_stop_the_splitting() -> None:
    spare = SpareCores.alone(2)
    splitter, run = RowSplitter(spare, threads=1), Recorded(batch_major=False)
    splitter.run(run, rows())
    run.parts.clear()
    outputs = splitter.run(run, rows())
    assert [n for n, _ in run.parts][-1] == ROWS  # the parts could not be joined: it ran whole
    assert outputs[1].shape == (1,)
    run.parts.clear()
    splitter.run(run, rows())
    assert [n for n, _ in run.parts] == [ROWS]


def test_a_failed_part_fails_the_batch_and_gives_the_cores_back() -> None:
    spare = SpareCores.alone(2)
    splitter = RowSplitter(spare, threads=1)
    splitter.run(Recorded(), rows())
    with pytest.raises(RuntimeError, match="a part failed"):
        splitter.run(Recorded(fail_on=ROWS * 3 - 3), rows())  # a row of the second part
    assert spare.borrow(2) == 2


class CountedLoans(SpareCores):
    """Two cores, one of them the instance's own (its thread counts it while it runs a batch)."""

    def __init__(self) -> None:
        super().__init__(2, memoryview(bytearray(4)).cast("i"), 0)
        self.loans: list[int] = []
        self.computing(1)

    def borrow(self, most: int) -> int:
        claimed = super().borrow(most)
        self.loans.append(claimed)
        return claimed


def test_onnx_rank_answers_the_same_in_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_split, "PART_MIN_NS", 1_000)  # parts of any batch that takes 2 µs, on any machine
    repository = write_example_repository(tmp_path / "repo")
    config = parse_config((repository / "rank" / "config.pbtxt").read_text())
    path = repository / "rank" / "1" / "model.onnx"
    spare = CountedLoans()
    parted = OnnxBackend().load(path, config, InstanceSettings(0, 1, spare))
    whole = OnnxBackend().load(path, config, InstanceSettings(0, 2))
    features = np.random.default_rng(0).random((ROWS, RANK_FEATURES), np.float32)
    expected = whole.infer({"features": features}, ["score"])["score"]
    for _ in range(3):  # the first runs whole and times it; then in two parts
        np.testing.assert_allclose(parted.infer({"features": features}, ["score"])["score"], expected, rtol=1e-6)
    assert spare.loans == [1, 1]


def test_a_model_that_does_not_batch_is_never_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_split, "PART_MIN_NS", 1_000)
    repository = write_example_repository(tmp_path / "repo")
    config = parse_config((repository / "rank" / "config.pbtxt").read_text())
    config.max_batch_size = 0  # its first dimension is then the model's own, not a batch of rows
    spare = CountedLoans()
    model = OnnxBackend().load(repository / "rank" / "1" / "model.onnx", config, InstanceSettings(0, 1, spare))
    features = np.random.default_rng(0).random((ROWS, RANK_FEATURES), np.float32)
    for _ in range(3):
        model.infer({"features": features}, ["score"])
    assert spare.loans == []


def test_an_instance_with_every_core_never_borrows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_split, "PART_MIN_NS", 1_000)
    repository = write_example_repository(tmp_path / "repo")
    config = parse_config((repository / "rank" / "config.pbtxt").read_text())
    spare = CountedLoans()
    spare.computing(1)  # both cores are the instance's own, as for one instance in one process
    model = OnnxBackend().load(repository / "rank" / "1" / "model.onnx", config, InstanceSettings(0, 2, spare))
    features = np.random.default_rng(0).random((ROWS, RANK_FEATURES), np.float32)
    for _ in range(3):
        model.infer({"features": features}, ["score"])
    assert spare.loans == []


def test_a_session_on_every_core_by_its_own_parameter_never_borrows(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_split, "PART_MIN_NS", 1_000)
    repository = write_example_repository(tmp_path / "repo")
    config = parse_config((repository / "rank" / "config.pbtxt").read_text()
                          + 'parameters { key: "intra_op_thread_count" value: { string_value: "0" } }\n')
    spare = CountedLoans()
    model = OnnxBackend().load(repository / "rank" / "1" / "model.onnx", config, InstanceSettings(0, 1, spare))
    features = np.random.default_rng(0).random((ROWS, RANK_FEATURES), np.float32)
    for _ in range(3):
        model.infer({"features": features}, ["score"])
    assert spare.loans == []  # ONNX Runtime's 0 is every core: nothing idle to add
