"""InFlight: when a request counts as alone in the process (core/loop_gate.py's lone budget)."""

from __future__ import annotations

import time

import pytest

from modelhost.core import in_flight as in_flight_module
from modelhost.core.in_flight import QUIET_S, WAITED_S, InFlight


def test_a_request_is_alone_until_another_arrives_beside_it_and_for_a_while_after() -> None:
    in_flight = InFlight()
    in_flight.arrived("a")
    assert in_flight.alone()
    in_flight.arrived("b")
    assert not in_flight.alone()
    in_flight.left("b")
    assert not in_flight.alone()  # alone again, but crowded just now: a lone run could hold up the next one
    in_flight.crowded_at -= QUIET_S
    assert in_flight.alone()


def test_an_arrival_from_another_connection_right_after_an_answer_had_waited_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(in_flight_module, "WAITED_S", 10.0)  # "right after", however loaded the test machine
    in_flight = InFlight()
    in_flight.arrived("a")
    in_flight.left("a")
    in_flight.arrived("a")  # the same connection's next request: the answer went first
    assert in_flight.alone()
    in_flight.left("a")
    in_flight.arrived("b")  # counted at once after "a"'s answer: it was read once the loop was free
    assert not in_flight.alone()


def test_an_arrival_from_another_connection_later_is_alone() -> None:
    in_flight = InFlight()
    in_flight.arrived("a")
    in_flight.left("a")
    time.sleep(WAITED_S + 0.01)
    in_flight.arrived("b")
    assert in_flight.alone()


def test_ensemble_steps_beside_each_other_are_not_alone() -> None:
    in_flight = InFlight()
    in_flight.arrived()
    in_flight.parallel_steps = 1
    assert not in_flight.alone()
