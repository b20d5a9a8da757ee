"""A handler model's requests and responses: a model that takes whole requests rather than tensors (a TorchServe
archive's handler, a SageMaker PyTorch `inference.py`), run through the same scheduler and instances as any model.

Such a model has two signatures. Its served one, for tensor APIs (KServe V2, TF Serving): input `body` (BYTES,
one element per request of the batch) and output `response` (BYTES, the handler's answer to it). And the named
signature `handler`, for the front-ends that speak the handler's own protocol: input `request` and output
`response`, object arrays of one `HandlerRequest` and one `HandlerResponse` per request, carrying what tensors
cannot (several parameters with their content types, headers; status, content type and headers per answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelhost.core.partial_answers import PartialAnswers

HANDLER_SIGNATURE = "handler"
HANDLER_INPUT = "request"
BODY_INPUT = "body"
RESPONSE_OUTPUT = "response"
STREAM_NEXT_HEADER = "ts_stream_next"  # TorchServe's: "true" on an intermediate answer, "false" on a stream's last


@dataclass(frozen=True, slots=True)
class HandlerRequest:
    """One request as its client sent it: each parameter's bytes and the content type it came with ("" when none;
    `{"body": ...}` for a whole body), the request's headers, and its id. `partials`, where the front-end streams
    answers, takes the handler's intermediate answers (HandlerResponses) to it; it stays in the server's process."""

    parameters: dict[str, tuple[str, bytes]]  # name -> (content type, value)
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str = ""
    partials: PartialAnswers | None = field(default=None, compare=False, repr=False)

    def __reduce__(self) -> tuple[type[HandlerRequest], tuple[object, ...]]:
        return HandlerRequest, (self.parameters, self.headers, self.request_id)  # pickled without dataclass code


@dataclass(frozen=True, slots=True)
class HandlerResponse:
    """The handler's answer to one request. `error` marks an answer the server made for the handler's failure
    (it raised, returned the wrong count, ran out of memory): `body` is then the message, for the protocol to put
    in its own error shape."""

    body: bytes
    status: int = 200
    phrase: str = ""
    content_type: str | None = None  # None: the handler set none (TorchServe then sends none)
    headers: dict[str, str] = field(default_factory=dict)
    error: bool = False

    def __reduce__(self) -> tuple[type[HandlerResponse], tuple[object, ...]]:
        return HandlerResponse, (self.body, self.status, self.phrase, self.content_type, self.headers, self.error)

    @property
    def nbytes(self) -> int:
        """The body's size, which the server's output-size limit counts."""
        return len(self.body)
