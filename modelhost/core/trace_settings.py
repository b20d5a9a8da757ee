"""The trace extension's settings, global and per model, and which requests they trace.

Triton's rules: a model's own value wins, else the global one; a global value cleared (null) returns to
what the server started with, a model's cleared returns to following the global one. `trace_count` counts
down as traces are taken (-1: no end) and `trace_rate` counts requests, each in the scope that sets it (the
model's when it has its own value, else the global one shared by every model without).

Thread contract: the event loop alone reads and changes these (the front-ends' handlers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelhost.core.trace_config import LEVELS, TraceStartup
from modelhost.errors import ErrorKind, ModelhostError, invalid

# Each setting -> (the TraceValues field, the least integer it takes; None: a list of levels).
_CHANGEABLE = {"trace_level": ("levels", None), "trace_rate": ("rate", 0), "trace_count": ("count", -1),
               "log_frequency": ("log_frequency", 0)}
_FIXED = ("trace_file", "trace_mode")
SETTING_NAMES = (*_CHANGEABLE, *_FIXED)
# A setting's new values (None: clear it), as the front-ends hand them in.
Changes = Mapping[str, Sequence[str] | None]


@dataclass(frozen=True, slots=True)
class Sampling:
    """What one model's requests are traced by: its levels, and the scopes (model name or None: global) whose
    request counter and remaining count it uses."""

    levels: tuple[str, ...]
    rate: int
    rate_scope: str | None
    count_scope: str | None


class TraceSettings:
    def __init__(self, startup: TraceStartup) -> None:
        self._startup = startup
        self._global: dict[str, Any] = {}  # field -> value, over the startup values
        self._models: dict[str, dict[str, Any]] = {}
        self._seen: dict[str | None, int] = {None: 0}  # requests counted for the rate, per scope
        self._remaining: dict[str | None, int] = {None: startup.values.count}
        self._sampling: dict[str, Sampling] = {}  # per model, rebuilt after any change
        self.active = False  # any scope at a level other than OFF: what the hot path checks
        self._refresh()

    def get(self, model: str | None = None) -> dict[str, str | list[str]]:
        """The settings in force for `model` (None: the global ones), as the API answers them."""
        value = self._value
        return {
            "trace_file": Path(self._startup.file).name,  # the name only: clients are not told server paths
            "trace_level": list(value("levels", model)),
            "trace_rate": str(value("rate", model)),
            "trace_count": str(self._remaining[self._count_scope(model)]),
            "log_frequency": str(value("log_frequency", model)),
            "trace_mode": self._startup.mode,
        }

    def update(self, changes: Changes, model: str | None = None) -> dict[str, str | list[str]]:
        """Apply every change or none: INVALID_INPUT for a value that is not one of the setting's, UNSUPPORTED for
        a setting only the operator sets; then the settings in force, as `get`."""
        parsed = {name: _parse(name, values) for name, values in changes.items()}
        target = self._global if model is None else self._models.setdefault(model, {})
        for name, value in parsed.items():
            attribute = _CHANGEABLE[name][0] if name in _CHANGEABLE else ""
            if not attribute:
                continue  # a fixed setting cleared: it has nothing to clear
            if value is None:
                target.pop(attribute, None)
            else:
                target[attribute] = value
            if attribute == "count":
                self._reset_count(model, value)
            if attribute == "rate":
                self._seen[model] = 0
        if model is not None and not target:
            del self._models[model]
        self._refresh()
        return self.get(model)

    def log_frequency(self) -> int:
        """The global log_frequency: how many traces each write of the trace file holds."""
        return int(self._value("log_frequency", None))

    def sampling(self, model: str) -> Sampling:
        found = self._sampling.get(model)
        return found if found is not None else self._sampling[""]

    def take(self, sampling: Sampling) -> bool:
        """Count one request of a model sampled by `sampling`: whether to trace it (its turn by the rate, and
        traces left). Tracing at OFF or at rate 0 takes none."""
        if sampling.levels[0] == "OFF" or not sampling.rate:
            return False
        seen = self._seen[sampling.rate_scope] = self._seen[sampling.rate_scope] + 1
        if seen % sampling.rate:
            return False
        return self.take_count(sampling)

    def take_count(self, sampling: Sampling) -> bool:
        """One of the traces left (True, counted) or none left (False)."""
        left = self._remaining[sampling.count_scope]
        if left == 0:
            return False
        if left > 0:
            self._remaining[sampling.count_scope] = left - 1
        return True

    def _value(self, attribute: str, model: str | None) -> Any:
        own = self._models.get(model, {}) if model is not None else {}
        if attribute in own:
            return own[attribute]
        return self._global.get(attribute, getattr(self._startup.values, attribute))

    def _count_scope(self, model: str | None) -> str | None:
        return model if model is not None and "count" in self._models.get(model, {}) else None

    def _reset_count(self, model: str | None, value: int | None) -> None:
        if model is None:
            self._remaining[None] = self._startup.values.count if value is None else value
        elif value is None:
            self._remaining.pop(model, None)
        else:
            self._remaining[model] = value

    def _refresh(self) -> None:
        scopes: list[str | None] = [None, *self._models]
        self._sampling = {"": self._sampling_of(None)}
        for model in self._models:
            self._sampling[model] = self._sampling_of(model)
            self._seen.setdefault(model, 0)
        self.active = any(self._value("levels", scope)[0] != "OFF" for scope in scopes)

    def _sampling_of(self, model: str | None) -> Sampling:
        own = self._models.get(model, {}) if model is not None else {}
        return Sampling(self._value("levels", model), self._value("rate", model),
                        model if "rate" in own else None, self._count_scope(model))


def _parse(name: str, values: Sequence[str] | None) -> Any:
    """The value a setting's strings stand for (None: clear it)."""
    if name in _FIXED:
        if values is not None and len(values):
            flag = "triton,file=PATH" if name == "trace_file" else "mode=MODE"
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"trace setting '{name}' cannot be changed through the "
                                 f"API: the operator sets it when starting the server (--trace-config {flag})")
        return None
    if name not in _CHANGEABLE:
        raise invalid(f"unknown trace setting '{name}'; the settings are {', '.join(SETTING_NAMES)}")
    if values is None or not len(values):
        return None
    least = _CHANGEABLE[name][1]
    if least is None:
        return _levels(values)
    if len(values) != 1:
        raise invalid(f"trace setting '{name}' takes one value, got {len(values)}")
    text = values[0]
    number = int(text) if text.lstrip("-").isdigit() and text.isascii() and len(text) < 20 else None
    if number is None or number < least:
        what = "a non-negative integer" if least == 0 else f"an integer of at least {least}"
        raise invalid(f"trace setting '{name}' must be {what}, got {text[:64]!r}")
    return number


def _levels(values: Sequence[str]) -> tuple[str, ...]:
    levels = tuple(dict.fromkeys(values))
    for level in levels:
        if level not in LEVELS:
            raise invalid(f"trace setting 'trace_level' must hold levels of {', '.join(LEVELS)}, got {level[:64]!r}")
    if "OFF" in levels and len(levels) > 1:
        raise invalid("trace setting 'trace_level' cannot hold OFF with other levels")
    return levels
