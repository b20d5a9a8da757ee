"""torch for a TorchServe handler's worker, imported when the handler first uses it rather than when TorchServe's
modules are imported.

TorchServe's `ts.service` imports `ts.protocol.otf_message_handler`, which imports torch for one isinstance check
(a tensor answer streamed by `send_intermediate_predict_response`): a worker whose handler never touches torch
would pay torch's import (seconds of CPU) at every start, restart and scale-up. Until something asks it for an
attribute, `torch` is a stand-in module; its first attribute asked for imports the real torch, which then replaces
it in sys.modules, and the stand-in answers every later attribute from it. So a handler that uses torch (`import
torch; torch.nn...`, `from torch import nn`, `import torch.nn`, a BaseHandler) loads it then, as before; one that
does not never does. (importlib's LazyLoader cannot do this: an `import torch` statement asks the module for its
`__spec__`, which loads it.)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


class _DeferredTorch(types.ModuleType):
    """The stand-in: only its spec and name are its own; any other attribute is the real torch's."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get("torch") is self:
            del sys.modules["torch"]
        return getattr(importlib.import_module("torch"), name)


def defer_torch_import() -> None:
    """Make `torch` a stand-in in this process; nothing when torch is imported already or not installed."""
    if "torch" in sys.modules:
        return
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return
    stand_in = _DeferredTorch("torch")
    stand_in.__spec__ = spec
    sys.modules["torch"] = stand_in


def loaded_torch() -> types.ModuleType | None:
    """torch when it has been imported for real (a handler used it), else None: asking the stand-in for anything
    would import it."""
    module = sys.modules.get("torch")
    return None if module is None or isinstance(module, _DeferredTorch) else module
