"""Messages between the server and a Python model's worker process over a Unix socket pair.

A message is any picklable object, pickled with protocol 5: numpy array data travels out of band, written
straight from the array's memory and read into one buffer per array that the unpickled array then uses, so
the pickle itself stays small and no array is copied into or out of it. Frame: pickle length and buffer
count, each buffer's length, the pickle, the buffers.

Both ends are trusted (the server and the worker it started); one call at a time per channel, made either by a
thread (`send`, `receive`: blocking, with deadlines) or on an event loop (`send_async`, `receive_async`).
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import time
from typing import Any

_HEADER = struct.Struct("!QI")  # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("!Q")
_MAX_PARTS = 512  # parts per sendmsg call, under the kernel's IOV_MAX (1024)
_FIRST_READ = 64 * 1024  # a message this small arrives in one read
_JOIN_BELOW = 256 * 1024  # a message this small is joined and written at once from the event loop


class ChannelClosed(Exception):
    """The other end is gone: its process exited or closed the socket."""


class Channel:
    """One end of a socket pair. `deadline` arguments are time.monotonic() values; None waits forever;
    a deadline that passes raises TimeoutError, leaving the channel unusable (the caller kills the worker)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._carry = b""  # bytes of the next message that the last read took with its own

    def send(self, message: Any, deadline: float | None = None) -> None:
        """Send one message; pickling errors raise before anything is written."""
        self._write(_frame(message), deadline)

    def receive(self, deadline: float | None = None) -> Any:
        """Wait for the next message."""
        message = _Message(self._carry)
        try:
            while (room := message.room()) is not None:
                self._sock.settimeout(_remaining(deadline))
                count = self._sock.recv_into(room)
                if not count:
                    raise ChannelClosed("the other end closed the channel")
                message.received(count)
        except TimeoutError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        self._carry = message.surplus()
        return message.load()

    async def send_async(self, message: Any) -> None:
        """`send` on the running event loop (which waits for the socket, never blocking)."""
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        parts = _frame(message)
        try:
            if sum(part.nbytes for part in parts) <= _JOIN_BELOW:  # one write for a small message
                await loop.sock_sendall(self._sock, b"".join(parts))
                return
            for part in parts:
                if part.nbytes:
                    await loop.sock_sendall(self._sock, part)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    async def receive_async(self) -> Any:
        """`receive` on the running event loop."""
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        message = _Message(self._carry)
        try:
            while (room := message.room()) is not None:
                count = await loop.sock_recv_into(self._sock, room)
                if not count:
                    raise ChannelClosed("the other end closed the channel")
                message.received(count)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        self._carry = message.surplus()
        return message.load()

    def close(self) -> None:
        self._sock.close()

    def _write(self, parts: list[memoryview], deadline: float | None) -> None:
        parts = [part for part in parts if part.nbytes]
        try:
            while parts:
                self._sock.settimeout(_remaining(deadline))
                sent = self._sock.sendmsg(parts[:_MAX_PARTS])
                while parts and sent >= parts[0].nbytes:
                    sent -= parts[0].nbytes
                    parts.pop(0)
                if sent:
                    parts[0] = parts[0][sent:]
        except TimeoutError:
            raise
        except OSError as exc:  # EPIPE, ECONNRESET: the worker died
            raise ChannelClosed(str(exc)) from exc


class _Message:
    """One message as it is read: into a first buffer as large as a small message, then (once its header says how
    long it is) into one of its whole length, so that a message takes one read when it is small and no copy of
    its data when it is large. A read into the first buffer may take the start of the next message too (the other
    end sent several in a row): `surplus` is that, which the next message starts from (`carry`)."""

    def __init__(self, carry: bytes = b"") -> None:
        self._buffer = bytearray(max(_FIRST_READ, len(carry)))
        self._buffer[: len(carry)] = carry
        self._filled = len(carry)
        self._total: int | None = None  # known once the header and buffer lengths are in
        self._parts: tuple[int, tuple[int, ...]] = (0, ())  # pickle length, buffer lengths

    def room(self) -> memoryview | None:
        """Where the next read goes; None when the message is complete."""
        if self._total is None:
            self._measure()
        end = self._total if self._total is not None else len(self._buffer)
        if self._total is not None and self._filled >= self._total:
            return None
        if end > len(self._buffer):
            grown = bytearray(end)
            grown[: self._filled] = memoryview(self._buffer)[: self._filled]
            self._buffer = grown
        return memoryview(self._buffer)[self._filled:end]

    def received(self, count: int) -> None:
        self._filled += count

    def surplus(self) -> bytes:
        """What was read past this message's end (its whole length read)."""
        assert self._total is not None
        return bytes(memoryview(self._buffer)[self._total:self._filled])

    def _measure(self) -> None:
        if self._filled < _HEADER.size:
            return
        length, count = _HEADER.unpack_from(self._buffer)
        prefix = _HEADER.size + _LENGTH.size * count
        if self._filled < prefix:
            if prefix > len(self._buffer):
                self._buffer.extend(bytes(prefix - len(self._buffer)))
            return
        sizes = struct.unpack_from(f"!{count}Q", self._buffer, _HEADER.size)
        self._parts = (length, sizes)
        self._total = prefix + length + sum(sizes)

    def load(self) -> Any:
        length, sizes = self._parts
        view = memoryview(self._buffer)
        start = _HEADER.size + _LENGTH.size * len(sizes)
        data = view[start:start + length]
        start += length
        buffers = []
        for size in sizes:
            buffers.append(view[start:start + size])
            start += size
        return pickle.loads(data, buffers=buffers)


def _frame(message: Any) -> list[memoryview]:
    """A message's parts as written: header, pickle, out-of-band buffers. Pickling errors raise here."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    header = _HEADER.pack(len(data), len(raws)) + b"".join(_LENGTH.pack(raw.nbytes) for raw in raws)
    return [memoryview(header), memoryview(data), *raws]


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline passed")
    return remaining
