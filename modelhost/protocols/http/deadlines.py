"""A connection's deadlines, kept by one lazy timer.

A request head must be complete within head_timeout of its first byte (of the accept, for a connection's
first request); a body must gain min_body_rate bytes/s over each body_timeout window; a connection that
waits for buffer budget longer than body_timeout is answered 503; a write stalled for send_timeout, or a
close that cannot flush within it, aborts; a lingering close ends after LINGER_SECONDS (at most
send_timeout); a keep-alive connection idle for idle_timeout closes. Each clock (`_window_start` or a
`*_since` field of ConnectionState) starts and stops where its event happens; while reading is paused
(the server's doing) the head and body clocks stand still.
"""

from __future__ import annotations

from modelhost.protocols.http.connection_state import ConnectionState
from modelhost.protocols.http.refusal import LINGER_SECONDS


class Deadlines(ConnectionState):
    """The deadline timer of HttpConnection: arms it for the soonest clock and enforces what is due."""

    def _schedule(self, when: float) -> None:
        # One timer for every deadline: moved earlier when a sooner deadline starts; when it fires
        # early (the deadline it was set for has ended) it re-arms for the next one.
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        now, limits = self._loop.time(), self._limits
        reading = self._paused_since is None
        for since in (self._write_since, self._closing_since):
            if since is not None and now >= since + limits.send_timeout:
                self.abort()
                return
        if self._linger_since is not None and now >= self._linger_since + min(LINGER_SECONDS, limits.send_timeout):
            self._linger_since = None
            self._close()
        if self._waiting_since is not None and now >= self._waiting_since + limits.body_timeout:
            self._reject(503, f"the server's buffer for request bytes (--http-max-buffered-bytes) stayed full for "
                              f"{limits.body_timeout:g} s; retry later", ((b"retry-after", b"1"),))
        elif reading and self._head_since is not None and now >= self._head_since + limits.head_timeout:
            if self._in_head:
                self._reject(408, f"the request head did not arrive within {limits.head_timeout:g} s "
                                  "(--http-head-timeout-seconds)")
            else:  # not a byte of a request yet: nothing to answer
                self._head_since = None
                self._close()
        elif reading and self._window_start is not None and now >= self._window_start + limits.body_timeout:
            if self._received - self._window_received < limits.min_body_bytes_per_window:
                self._reject(408, f"the request body arrived slower than {limits.min_body_rate} bytes/s over "
                                  f"{limits.body_timeout:g} s (--http-min-body-rate, --http-body-timeout-seconds)")
            else:
                self._window_start, self._window_received = now, self._received
        elif self._idle_since is not None and now >= self._idle_since + limits.idle_timeout:
            self._idle_since = None
            self._close()
        self._reschedule()

    def _reschedule(self) -> None:
        limits = self._limits
        reading = self._paused_since is None
        clocks = [(self._write_since, limits.send_timeout), (self._closing_since, limits.send_timeout),
                  (self._linger_since, min(LINGER_SECONDS, limits.send_timeout)),
                  (self._waiting_since, limits.body_timeout), (self._idle_since, limits.idle_timeout)]
        if reading:
            clocks += [(self._head_since, limits.head_timeout), (self._window_start, limits.body_timeout)]
        deadlines = [since + timeout for since, timeout in clocks if since is not None]
        if deadlines and self._transport is not None:
            self._schedule(min(deadlines))
