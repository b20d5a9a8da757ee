"""What an isolated worker process runs (backends/python/isolated.py starts it, stub.py is its main): the spec the
server sends it, which must pickle and whose class the worker can import, and the model that spec loads there.

A Python backend's model.py (user_model.UserCodeSpec) is one; a TorchServe archive's handler
(backends/torchserve/worker_model.HandlerSpec) another.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class WorkerModel(Protocol):
    """One loaded model in the worker; the worker calls it one batch at a time."""

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run one batch; raises ModelhostError (the user's failure: INTERNAL, naming the model)."""
        ...

    def finalize(self) -> None:
        """Called once before the worker exits; raises user_model.UserCodeError when the user's code raised."""
        ...

    # Optional: `send_partials_to(send)`, called once after load, gives a model that answers requests in parts
    # `send(index, answer)`: during execute it sends answer to request `index` of the batch, ahead of the reply.


class WorkerSpec(Protocol):
    """How to load one instance's model in a worker."""

    @property
    def path(self) -> str:
        """The file whose code the worker runs, for messages."""
        ...

    @property
    def label(self) -> str:
        """The instance in words ("Python model 'm' version 1 instance 0"), for messages."""
        ...

    def environment(self) -> dict[str, str]:
        """Variables the worker process gets beside the server's own."""
        ...

    def load(self) -> WorkerModel:
        """Load the model (in the worker); raises user_model.UserCodeError when it cannot."""
        ...
