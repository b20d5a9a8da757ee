"""Refusing a request: the transport's own error answer, given in the request's turn, then a lingering close."""

from __future__ import annotations

import orjson

from modelhost.protocols.http.connection_state import ConnectionState
from modelhost.protocols.http.exchange import Answer, response_head

LINGER_SECONDS = 2.0  # how long an error answer waits for the client to stop sending before closing
_JSON = [(b"content-type", b"application/json")]


class Refusal(ValueError):
    """Raised in a parser callback to answer with `status` (httptools turns it into a callback error) and close;
    `answer`: a whole answer (status, headers, body) to give instead of an error built from `message`."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                 answer: Answer | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers, self.answer = status, message, headers, answer


class Refusals(ConnectionState):
    """How HttpConnection answers a request it refuses (a limit, a deadline, a malformed request) and closes."""

    def _reject(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                answer: Answer | None = None) -> None:
        if self._in_head or self._in_body:  # a request being received: its bytes are dropped
            self._release(self._request)
        self._budget.release(self._head_charge)
        self._head_charge, self._in_head = 0, False
        self._drop_body()
        self._window_start = self._head_since = self._waiting_since = None
        self._in_body = False
        self._budget.forget(self)
        self._answered = False
        if answer is not None:
            status, answer_headers, body = answer
            response = [response_head(status, answer_headers, len(body), False), body]
        elif self._refusal_shape is not None:
            shaped, body = self._refusal_shape(status, message)
            response = [response_head(status, [*shaped, *headers], len(body), False), body]
        else:
            body = orjson.dumps({"error": message})
            response = [response_head(status, [*_JSON, *headers], len(body), False), body]
        if self._busy or self._pipeline:  # answer the requests received before this one first, in order
            self._rejection = response
            self._stop_reading()
            return
        self._stop_reading()
        if self._transport is not None:
            self._transport.writelines(response)
            self._linger()

    def _linger(self) -> None:
        """After an error answer: send FIN, then read and discard what the client still sends for a moment
        before closing, so that it reads the answer rather than a reset (nginx's lingering close)."""
        assert self._transport is not None
        if not self._transport.can_write_eof():
            self._close()
            return
        self._transport.write_eof()
        self._linger_since = self._loop.time()
        self._stopped, self._waiting_since = False, None
        self._update_reading()
        self._schedule(self._linger_since + min(LINGER_SECONDS, self._limits.send_timeout))
