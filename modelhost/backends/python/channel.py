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


class ChannelClosed(Exception):
    """The other end is gone: its process exited or closed the socket."""


class Channel:
    """One end of a socket pair. `deadline` arguments are time.monotonic() values; None waits forever;
    a deadline that passes raises TimeoutError, leaving the channel unusable (the caller kills the worker)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, message: Any, deadline: float | None = None) -> None:
        """Send one message; pickling errors raise before anything is written."""
        self._write(_frame(message), deadline)

    def receive(self, deadline: float | None = None) -> Any:
        """Wait for the next message."""
        length, count = _HEADER.unpack(self._read(_HEADER.size, deadline))
        sizes = struct.unpack(f"!{count}Q", self._read(_LENGTH.size * count, deadline)) if count else ()
        data = self._read(length, deadline)
        buffers = [self._read(size, deadline) for size in sizes]
        return pickle.loads(data, buffers=buffers)

    async def send_async(self, message: Any) -> None:
        """`send` on the running event loop (which waits for the socket, never blocking)."""
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        try:
            for part in _frame(message):
                if part.nbytes:
                    await loop.sock_sendall(self._sock, part)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    async def receive_async(self) -> Any:
        """`receive` on the running event loop."""
        loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        length, count = _HEADER.unpack(await self._read_async(loop, _HEADER.size))
        sizes = struct.unpack(f"!{count}Q", await self._read_async(loop, _LENGTH.size * count)) if count else ()
        data = await self._read_async(loop, length)
        buffers = [await self._read_async(loop, size) for size in sizes]
        return pickle.loads(data, buffers=buffers)

    async def _read_async(self, loop: asyncio.AbstractEventLoop, size: int) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        received = 0
        try:
            while received < size:
                count = await loop.sock_recv_into(self._sock, view[received:])
                if not count:
                    raise ChannelClosed("the other end closed the channel")
                received += count
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        return buffer

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

    def _read(self, size: int, deadline: float | None) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        received = 0
        try:
            while received < size:
                self._sock.settimeout(_remaining(deadline))
                count = self._sock.recv_into(view[received:])
                if not count:
                    raise ChannelClosed("the other end closed the channel")
                received += count
        except TimeoutError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc
        return buffer


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
