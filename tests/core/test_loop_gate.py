"""LoopGate: the row limit for running batches on the event loop, learned from measured executions."""

from __future__ import annotations

from modelhost.core import loop_gate
from modelhost.core.loop_gate import MAX_BUDGET_NS, MAX_ROWS, MIN_BUDGET_NS, SLOW_STRIKES, LoopGate

BUDGET = 20_000


def test_nothing_runs_on_the_loop_before_a_measurement() -> None:
    assert LoopGate(BUDGET).max_rows == 0


def test_a_fast_execution_allows_twice_its_rows() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    assert gate.max_rows == 2
    gate.learn(2, 5_000, on_loop=True)
    gate.learn(4, 5_000, on_loop=True)
    assert gate.max_rows == 8
    gate.learn(1, 5_000, on_loop=True)  # a smaller fast batch never lowers the limit
    assert gate.max_rows == 8


def test_repeated_slow_executions_on_the_loop_halve_the_limit_below_their_rows() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(8, 5_000, on_loop=True)
    for _ in range(SLOW_STRIKES - 1):
        gate.learn(6, 50_000, on_loop=True)
    assert gate.max_rows == 16  # one slow run may be a preemption
    gate.learn(6, 50_000, on_loop=True)
    assert gate.max_rows == 3


def test_a_fast_execution_between_slow_ones_forgives_them() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=True)
    for _ in range(5):
        gate.learn(1, 50_000, on_loop=True)
        gate.learn(1, 5_000, on_loop=True)
    assert gate.max_rows == 2


def test_a_model_slow_at_one_row_leaves_the_loop_entirely() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    for _ in range(SLOW_STRIKES):
        gate.learn(1, 90_000, on_loop=True)
    assert gate.max_rows == 0


def test_slow_executions_on_threads_do_not_count_against_the_loop() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    for _ in range(10):
        gate.learn(1, 90_000, on_loop=False)
    assert gate.max_rows == 2


def test_slow_batches_larger_than_the_limit_change_nothing() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(2, 5_000, on_loop=True)
    for _ in range(SLOW_STRIKES):
        gate.learn(500, 900_000, on_loop=True)
    assert gate.max_rows == 4


def test_a_zero_budget_keeps_everything_on_threads() -> None:
    gate = LoopGate(0)
    gate.learn(1, 1, on_loop=True)
    assert gate.max_rows == 0


def test_the_limit_is_bounded() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(MAX_ROWS, 1_000, on_loop=True)
    assert gate.max_rows == MAX_ROWS


def test_the_default_budget_is_the_measured_handoff_cost_within_bounds() -> None:
    saved = loop_gate.default_budget_ns()
    try:
        assert loop_gate.use_handoff_cost(95_000) == 95_000 == loop_gate.default_budget_ns()
        assert loop_gate.use_handoff_cost(3_000) == MIN_BUDGET_NS  # bare metal: no less than the first VM's figure
        assert loop_gate.use_handoff_cost(5_000_000) == MAX_BUDGET_NS  # a stalled measurement holds the loop no longer
    finally:
        loop_gate.use_handoff_cost(saved)
