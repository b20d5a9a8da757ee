"""PartialAnswers (core/partial_answers.py): a request's partial answers, put from the loop or an instance's thread
and read on the loop in order, bounded in unread bytes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from modelhost.core.partial_answers import PartialAnswers
from modelhost.errors import ErrorKind, ModelhostError


async def read_all(answers: PartialAnswers) -> list[object]:
    read = []
    while (answer := await answers.next()) is not None:
        read.append(answer)
    return read


def test_answers_from_a_thread_and_the_loop_arrive_in_order_until_closed() -> None:
    async def run() -> list[object]:
        answers = PartialAnswers(1 << 20)
        answers.put("first", 5)  # on the loop
        thread = threading.Thread(target=lambda: [answers.put(f"t{i}", 2) for i in range(100)])
        thread.start()
        reader = asyncio.ensure_future(read_all(answers))
        await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # the thread's puts are scheduled on the loop before this
        answers.close()
        answers.put("late", 1)  # after close: dropped
        return await reader

    assert asyncio.run(run()) == ["first", *(f"t{i}" for i in range(100))]


def test_unread_answers_over_the_limit_fail_the_stream() -> None:
    async def run() -> tuple[list[object], ModelhostError]:
        answers = PartialAnswers(10)
        answers.put("a", 6)
        first = await answers.next()
        answers.put("b", 6)
        answers.put("c", 6)  # 12 unread bytes: over
        with pytest.raises(ModelhostError) as caught:
            await answers.next()
        return [first], caught.value

    read, error = asyncio.run(run())
    assert read == ["a"]
    assert error.kind is ErrorKind.TOO_LARGE and "10-byte limit" in error.message
