"""The worker channel (backends/python/channel.py): messages of every size, numpy arrays out of band, from a thread
and from an event loop, and a closed other end."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import numpy as np
import pytest

from modelhost.backends.python.channel import Channel, ChannelClosed

MESSAGES: list[Any] = [
    ("ok", None),
    ("execute", {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, ["y"]),
    ("ok", {"big": np.random.default_rng(0).random((300, 1000)), "small": np.array([1, 2], np.int64)}),
    ("ok", {f"t{i}": np.full(3, i, np.int32) for i in range(2000)}),  # more buffer lengths than a first read
    ("ok", {"objects": np.array([b"a", b"bc", None], dtype=object)}),
]


def pair() -> tuple[Channel, Channel]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel(ours), Channel(theirs)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.all(a == b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def echo_thread(channel: Channel, count: int) -> threading.Thread:
    def run() -> None:
        for _ in range(count):
            channel.send(channel.receive())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("message", MESSAGES, ids=range(len(MESSAGES)))
def test_a_message_comes_back_the_same_between_threads(message: Any) -> None:
    ours, theirs = pair()
    echo_thread(theirs, 1)
    ours.send(message)
    assert same(ours.receive(deadline=None), message)


def test_messages_come_back_the_same_through_the_event_loop() -> None:
    ours, theirs = pair()
    echo_thread(theirs, len(MESSAGES) + 1)

    async def exchange() -> list[Any]:
        answers = []
        for message in MESSAGES:
            await ours.send_async(message)
            answers.append(await ours.receive_async())
        return answers

    answers = asyncio.run(exchange())
    assert all(same(answer, message) for answer, message in zip(answers, MESSAGES))
    ours.send(("after", 1))  # the same channel from a thread again
    assert ours.receive() == ("after", 1)


def test_messages_sent_in_a_row_each_arrive_whole_whichever_way_they_are_read() -> None:
    # A worker's partial answers go out one after another, ahead of its reply: one read may take several.
    ours, theirs = pair()
    sender = threading.Thread(target=lambda: [theirs.send(message) for message in MESSAGES * 2], daemon=True)
    sender.start()
    received = [ours.receive() for _ in MESSAGES]

    async def rest() -> list[Any]:
        return [await ours.receive_async() for _ in MESSAGES]

    received += asyncio.run(rest())
    assert all(same(answer, message) for answer, message in zip(received, MESSAGES * 2, strict=True))


def test_a_closed_other_end_is_channel_closed() -> None:
    ours, theirs = pair()
    theirs.close()
    with pytest.raises(ChannelClosed):
        ours.receive()

    async def receive() -> Any:
        return await ours.receive_async()

    with pytest.raises(ChannelClosed):
        asyncio.run(receive())
