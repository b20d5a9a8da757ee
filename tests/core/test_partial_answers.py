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


def test_the_last_answer_closes_and_a_failure_follows_what_was_put() -> None:
    async def run() -> tuple[list[object], list[object], ModelhostError]:
        streamed = PartialAnswers(1 << 20)
        thread = threading.Thread(target=lambda: [streamed.put("x", 1), streamed.put("y", 1, last=True),
                                                  streamed.put("after", 1)])
        thread.start()
        await asyncio.to_thread(thread.join)
        ended = await read_all(streamed)  # the last answer closed it: "after" is dropped
        failing = PartialAnswers(1 << 20)
        failing.put("a", 1)
        failing.fail(ModelhostError(ErrorKind.INTERNAL, "the model failed"))
        first = await failing.next()
        with pytest.raises(ModelhostError) as caught:
            await failing.next()
        return ended, [first], caught.value

    ended, first, error = asyncio.run(run())
    assert ended == ["x", "y"]
    assert first == ["a"] and error.message == "the model failed"


def test_abandoned_answers_are_cancelled_and_dropped() -> None:
    async def run() -> tuple[bool, object]:
        answers = PartialAnswers(1 << 20)
        answers.put("unread", 1)
        answers.abandon()  # the client left
        answers.put("later", 1)
        return answers.cancelled, await answers.next()

    assert asyncio.run(run()) == (True, None)
