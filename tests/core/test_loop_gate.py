"""LoopGate: the size limit for running batches on the event loop, learned from measured executions, and its
budget, fixed or learned from handoffs."""

from __future__ import annotations

from modelhost.core.loop_gate import (
    HANDOFF_SAMPLES,
    LONE_BUDGET_NS,
    MAX_BUDGET_NS,
    MAX_SIZE,
    MIN_BUDGET_NS,
    PROBE_EVERY,
    SLOW_STRIKES,
    LoopGate,
    configure,
)

BUDGET = 20_000


def test_nothing_runs_on_the_loop_before_a_measurement() -> None:
    assert LoopGate(BUDGET).max_size == 0


def test_a_fast_execution_allows_twice_its_size() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    assert gate.max_size == 2
    gate.learn(2, 5_000, on_loop=True)
    gate.learn(4, 5_000, on_loop=True)
    assert gate.max_size == 8
    gate.learn(1, 5_000, on_loop=True)  # a smaller fast batch never lowers the limit
    assert gate.max_size == 8


def test_repeated_slow_executions_on_the_loop_halve_the_limit_below_their_size() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(8, 5_000, on_loop=True)
    for _ in range(SLOW_STRIKES - 1):
        gate.learn(6, 50_000, on_loop=True)
    assert gate.max_size == 16  # one slow run may be a preemption
    gate.learn(6, 50_000, on_loop=True)
    assert gate.max_size == 3


def test_a_fast_execution_between_slow_ones_forgives_them() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=True)
    for _ in range(5):
        gate.learn(1, 50_000, on_loop=True)
        gate.learn(1, 5_000, on_loop=True)
    assert gate.max_size == 2


def test_a_model_slow_at_its_smallest_size_leaves_the_loop_entirely() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    for _ in range(SLOW_STRIKES):
        gate.learn(1, 90_000, on_loop=True)
    assert gate.max_size == 0


def test_slow_executions_on_threads_do_not_count_against_the_loop() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(1, 5_000, on_loop=False)
    for _ in range(10):
        gate.learn(1, 90_000, on_loop=False)
    assert gate.max_size == 2


def test_slow_batches_larger_than_the_limit_change_nothing() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(2, 5_000, on_loop=True)
    for _ in range(SLOW_STRIKES):
        gate.learn(500, 900_000, on_loop=True)
    assert gate.max_size == 4


def test_a_zero_budget_keeps_everything_on_threads() -> None:
    gate = LoopGate(0)
    gate.learn(1, 1, on_loop=True)
    assert gate.max_size == -1  # an empty request too: a model kept off the loop may block or call back into it


def test_the_limit_is_bounded() -> None:
    gate = LoopGate(BUDGET)
    gate.learn(MAX_SIZE, 1_000, on_loop=True)
    assert gate.max_size == MAX_SIZE


def test_an_adaptive_budget_is_the_median_handoff_within_bounds() -> None:
    gate = LoopGate(None)
    assert gate.adaptive and gate.budget_ns == MIN_BUDGET_NS  # before any handoff is seen
    for ns in (90_000, 150_000, 120_000):
        gate.learn_handoff(ns)
    assert gate.budget_ns == 120_000
    for _ in range(HANDOFF_SAMPLES):  # the oldest samples leave: the budget follows the machine
        gate.learn_handoff(30_000)
    assert gate.budget_ns == 30_000
    for _ in range(HANDOFF_SAMPLES):
        gate.learn_handoff(3_000)
    assert gate.budget_ns == MIN_BUDGET_NS  # a fast machine: no less than the old fixed budget
    for _ in range(HANDOFF_SAMPLES):
        gate.learn_handoff(5_000_000)
    assert gate.budget_ns == MAX_BUDGET_NS  # stalled wake-ups hold the loop no longer than this


def test_an_adaptive_gate_sends_one_request_in_probe_every_to_a_thread() -> None:
    gate = LoopGate(None)
    probes = [gate.should_probe() for _ in range(3 * PROBE_EVERY)]
    assert probes.count(True) == 3 and probes[PROBE_EVERY - 1]


def test_a_fixed_budget_neither_learns_handoffs_nor_probes() -> None:
    gate = LoopGate(BUDGET)
    gate.learn_handoff(150_000)
    assert gate.budget_ns == BUDGET and not gate.adaptive
    assert not any(gate.should_probe() for _ in range(3 * PROBE_EVERY))


def test_a_learned_gate_lets_a_lone_request_of_a_size_seen_within_the_lone_budget() -> None:
    gate = LoopGate(None)
    assert gate.lone_max_size == 0
    gate.learn(1_000, LONE_BUDGET_NS // 2, on_loop=False)
    assert gate.max_size == 0 and gate.lone_max_size == 1_000  # no extrapolation: only sizes seen
    gate.learn(4_000, LONE_BUDGET_NS + 1, on_loop=False)  # over it on a thread: nothing learned
    gate.learn(500, LONE_BUDGET_NS // 4, on_loop=True)  # a smaller one never lowers it
    assert gate.lone_max_size == 1_000


def test_repeated_slow_lone_executions_halve_the_lone_limit_below_their_size() -> None:
    gate = LoopGate(None)
    gate.learn(1_000, LONE_BUDGET_NS // 2, on_loop=False)
    for _ in range(SLOW_STRIKES - 1):
        gate.learn(800, LONE_BUDGET_NS * 2, on_loop=True)
    assert gate.lone_max_size == 1_000
    gate.learn(800, LONE_BUDGET_NS * 2, on_loop=True)
    assert gate.lone_max_size == 400
    for _ in range(SLOW_STRIKES):
        gate.learn(1_000, LONE_BUDGET_NS * 2, on_loop=False)  # slow on threads: no strike, no raise
    assert gate.lone_max_size == 400


def test_a_fixed_budget_never_runs_lone_requests_on_the_loop() -> None:
    for budget in (0, BUDGET):
        gate = LoopGate(budget)
        gate.learn(1, 1_000, on_loop=False)
        assert gate.lone_max_size == -1


def test_a_lone_budget_of_zero_keeps_lone_requests_off_the_loop() -> None:
    configure(0)
    try:
        gate = LoopGate(None)
        gate.learn(1, 1_000, on_loop=False)
        assert gate.lone_max_size == -1 and gate.max_size == 2  # the handoff limit still learns
    finally:
        configure(LONE_BUDGET_NS)
    configure(1_000_000)
    try:
        gate = LoopGate(None)
        gate.learn(10, 2_000_000, on_loop=False)
        assert gate.lone_max_size == 0  # over this process's budget
    finally:
        configure(LONE_BUDGET_NS)
