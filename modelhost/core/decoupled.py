"""A decoupled model's responses to one request (model_transaction_policy { decoupled: true }): zero, one or
many, as the model sends them, the last with the final flag.

The request runs through `ServedModel.run` like any other (checks, queue, statistics) with a PartialAnswers
(core/partial_answers.py) its model sends the responses to; `run` returns once the model's execute has, which
may be before its last response (a model may send from a thread of its own). The stream ends with the
response flagged final, or with the error that failed the request. When the reader leaves (the client went
away), the request is withdrawn if still queued and the model sees it cancelled (`PartialAnswers.cancelled`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from functools import partial

import numpy as np

from modelhost.core.partial_answers import PartialAnswers
from modelhost.core.served_model import ServedModel
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import InferRequest, InferResponse

# One response: its outputs, or the error the model answered with; and whether it is the request's last.
Response = tuple[InferResponse | ModelhostError, bool]


async def responses(served: ServedModel, request: InferRequest, max_output_bytes: int, priority: int,
                    timeout_us: int, spent_s: float) -> AsyncGenerator[Response, None]:
    """The model's responses to `request`, as it sends them; raises what fails the request. The caller holds the
    version until this ends."""
    names = served.signature.check_outputs(request.outputs)
    answers = PartialAnswers(max_output_bytes)
    run = asyncio.ensure_future(served.run(request.inputs, request.outputs, priority, timeout_us, max_output_bytes,
                                           request.signature, spent_s, responses=answers, origin=request))
    run.add_done_callback(partial(_ran, answers))
    try:
        while (answer := await answers.next()) is not None:
            outputs, final = answer
            if isinstance(outputs, ModelhostError):
                yield outputs, final
                continue
            shaped = served.signature.shape_outputs(outputs, names) if outputs else {}
            yield InferResponse(served.name, str(served.version), shaped, request.id), final
    finally:
        answers.abandon()
        if not run.done():
            run.cancel()  # still queued: withdrawn
        elif not run.cancelled():
            run.exception()  # retrieved: it was the stream's


def _ran(answers: PartialAnswers, run: asyncio.Future[dict[str, np.ndarray]]) -> None:
    """The request's execute is over: a failure ends the stream; outputs (from a model that does not stream)
    are its one, final response; empty ones mean the model sends its responses itself."""
    if run.cancelled():
        return
    error = run.exception()
    if error is not None:
        answers.fail(error if isinstance(error, ModelhostError) else
                     ModelhostError(ErrorKind.INTERNAL, f"the model failed: {error}"))
    elif run.result():
        answers.put((run.result(), True), 0, last=True)
