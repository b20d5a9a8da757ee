"""Triton's logging extension on Python logging: which lines the server writes, changeable while it runs.

Settings (Triton's names): `log_info`, `log_warning`, `log_error` (bool: whether INFO, WARNING and ERROR or
worse lines are written), `log_verbose_level` (>= 0; above 0 DEBUG lines are written too: Python has one
verbose level, so 1 and 5 write the same lines), `log_format` ("default": the server's usual lines, or
"ISO8601": UTC timestamps as 2026-11-26T22:21:21Z) and `log_file` ("": the console, where modelhost logs).

`log_file` names a path on the server: a client that could set it could make the server write where it
chooses, so it is reported and never changed over the API (a request that asks for another value is refused,
naming it). Changing the others is off unless the operator starts the server with --logging-updates (a client
could hide its errors from the log, or make every line a debug line); reading them is always allowed.

The composition root makes one LogSettings per process from --log-level and `install`s it on the root logger's
handlers: a filter (one check per log record, none per request) and the formatter. Front-ends call `current`
and `update` from the event loop; `update` checks every value before it changes any.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from modelhost.errors import ErrorKind, ModelhostError, client_value, invalid

FORMATS = {"default": ("%(asctime)s %(levelname)s %(name)s: %(message)s", None),
           "ISO8601": ("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%SZ")}
FLAGS = ("log_info", "log_warning", "log_error")
NAMES = ("log_file", *FLAGS, "log_verbose_level", "log_format")
MAX_VERBOSE_LEVEL = 2**32 - 1  # Triton's is a uint32
UPDATES_OFF = "its operator turns that on with --logging-updates"

log = logging.getLogger("modelhost.logging")


def update_refusal(updates: bool, workers: int) -> str | None:
    """Why clients may not change log settings on a server with these flags (None: they may)."""
    if not updates:
        return UPDATES_OFF
    if workers > 1:
        return (f"its {workers} worker processes (--workers) log on their own and one request reaches one of "
                "them; set the server's logging with --log-level")
    return None


class LogSettings(logging.Filter):
    """The settings, and the filter on the root logger's handlers that applies them to each record."""

    def __init__(self, level: str = "info", refusal: str | None = UPDATES_OFF, log_file: str = "",
                 process: str = "") -> None:
        """`level`: --log-level, the settings at start. `refusal`: why updates are refused (None: they are not).
        `process`: which process writes the lines ("worker 1" under --workers), after each line's level."""
        super().__init__()
        self._process = process
        start = logging.getLevelName(level.upper())
        self._values: dict[str, Any] = {
            "log_file": log_file, "log_info": start <= logging.INFO, "log_warning": start <= logging.WARNING,
            "log_error": start <= logging.ERROR, "log_verbose_level": 1 if start <= logging.DEBUG else 0,
            "log_format": "default"}
        self._refusal = refusal

    def install(self, root: logging.Logger | None = None) -> None:
        """Apply the settings to `root`'s handlers (the root logger's by default), as they are configured."""
        self._root = root or logging.getLogger()
        for handler in self._root.handlers:
            if self not in handler.filters:
                handler.addFilter(self)
        self._apply()

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.CRITICAL:
            return True  # the server is going down: always said
        if level >= logging.ERROR:
            return bool(self._values["log_error"])
        if level >= logging.WARNING:
            return bool(self._values["log_warning"])
        if level >= logging.INFO:
            return bool(self._values["log_info"])
        return bool(self._values["log_verbose_level"])

    def current(self) -> dict[str, Any]:
        """Every setting by name, as Triton's GET /v2/logging answers."""
        return dict(self._values)

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply `changes` (a None value changes nothing, as in Triton) and return every setting. INVALID_INPUT
        naming the setting for an unknown name, a value of the wrong type or a new log_file; UNSUPPORTED when
        updates are off (--logging-updates). Nothing changes unless every value is good."""
        wanted = {name: value for name, value in changes.items() if value is not None}
        for name, value in wanted.items():
            _check(name, value, self._values["log_file"])
        wanted = {name: value for name, value in wanted.items() if self._values[name] != value}
        if wanted and self._refusal is not None:
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"log settings cannot be changed over the API on this "
                                 f"server: {self._refusal}")
        if wanted:
            self._values.update(wanted)
            self._apply()
            log.warning("log settings changed by a client: %s",
                        ", ".join(f"{name}={value!r}" for name, value in sorted(wanted.items())))
        return self.current()

    def _lowest_level(self) -> int:
        values = self._values
        for level, on in ((logging.DEBUG, values["log_verbose_level"]), (logging.INFO, values["log_info"]),
                          (logging.WARNING, values["log_warning"]), (logging.ERROR, values["log_error"])):
            if on:
                return level
        return logging.CRITICAL

    def _apply(self) -> None:
        root = getattr(self, "_root", None)
        if root is None:
            return
        root.setLevel(self._lowest_level())  # records below it are never made; the filter drops the others
        line, dates = FORMATS[self._values["log_format"]]
        if self._process:
            line = line.replace("%(levelname)s ", f"%(levelname)s {self._process} ", 1)
        formatter = logging.Formatter(line, dates)
        if dates is not None:
            formatter.converter = time.gmtime
        for handler in root.handlers:
            handler.setFormatter(formatter)


def _check(name: str, value: Any, log_file: str) -> None:
    """INVALID_INPUT naming the setting when `value` is not one it takes."""
    if name in FLAGS:
        if not isinstance(value, bool):
            raise invalid(f"log setting '{name}' must be true or false, got {client_value(value)}")
    elif name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VERBOSE_LEVEL:
            raise invalid(f"log setting 'log_verbose_level' must be an integer from 0 to {MAX_VERBOSE_LEVEL}, "
                          f"got {client_value(value)}")
    elif name == "log_format":
        if not isinstance(value, str) or value not in FORMATS:
            raise invalid(f"log setting 'log_format' must be one of {', '.join(FORMATS)}, got {client_value(value)}")
    elif name == "log_file":
        if value != log_file:
            raise invalid(f"log setting 'log_file': log file location can not be updated through network protocol "
                          f"(Triton's words; a client may not choose where the server writes); it is "
                          f"{log_file or 'empty (the console)'}")
    else:
        raise invalid(f"unknown log setting {client_value(name)}; the settings are {', '.join(NAMES)}")
