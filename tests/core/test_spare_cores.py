"""Cores an execution may borrow while the rest of the server leaves them idle (core/spare_cores.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from modelhost.core.in_flight import InFlight
from modelhost.core.spare_cores import SpareCores, make_shared


def test_only_cores_nobody_computes_on_are_lent() -> None:
    spare = SpareCores.alone(4)
    spare.computing(1)  # this execution's own core
    assert spare.borrow(8) == 3
    assert spare.borrow(1) == 0  # all claimed
    spare.give_back(3)
    spare.computing(-1)
    assert spare.borrow(2) == 2


def test_workers_see_each_others_cores(tmp_path: Path) -> None:
    path = tmp_path / "spare-cores"
    make_shared(path, 2)
    assert path.stat().st_mode & 0o777 == 0o600
    first, second = SpareCores.shared(path, 0, 2), SpareCores.shared(path, 1, 2)
    second.computing(1)  # the other worker runs a batch
    assert first.borrow(2) == 1  # one core of two is idle
    first.give_back(1)
    first.computing(1)
    assert second.borrow(1) == 0  # both cores compute now
    first.computing(-1)
    assert second.borrow(1) == 1


def test_nothing_is_lent_while_other_requests_wait_in_the_process() -> None:
    in_flight = InFlight()
    spare = SpareCores.alone(4, in_flight)
    in_flight.requests = 2
    assert spare.borrow(3) == 0
    in_flight.requests = 1
    assert spare.borrow(3) == 3


def test_helpers_run_on_another_thread() -> None:
    spare = SpareCores.alone(2)
    caller = threading.get_ident()
    assert spare.submit(threading.get_ident).result(10) != caller
