"""TorchServe's error answers: an HTTP status, the Java exception's simple name and its message (tsfs §A1)."""

from __future__ import annotations


class TorchServeError(Exception):
    """An answer in TorchServe's error shape: HTTP status, the Java exception's simple name, the message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def model_not_found(name: str) -> TorchServeError:
    return TorchServeError(404, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> TorchServeError:
    return TorchServeError(404, "ModelVersionNotFoundException",
                           f"Model version: {version} does not exist for model: {name}")


def no_worker(name: str) -> TorchServeError:
    return TorchServeError(503, "ServiceUnavailableException",
                           f'Model "{name}" has no worker to serve inference request. Please use scale workers API to '
                           "add workers. If this is a sequence inference, please check if it is closed, or expired; "
                           "or exceeds maxSequenceJobQueueSize")
