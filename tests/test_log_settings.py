"""LogSettings on a logger of its own: --log-level as the settings at start, and which lines each setting lets out."""

from __future__ import annotations

import io
import logging

import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.log_settings import UPDATES_OFF, LogSettings, update_refusal


def logger_with(settings: LogSettings) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    logger = logging.getLogger(f"test-log-settings-{id(settings)}")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(out))
    settings.install(logger)
    return logger, out


def write_each_level(logger: logging.Logger) -> None:
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
        logger.log(level, "line at %s", logging.getLevelName(level))


@pytest.mark.parametrize(("level", "expected"), [
    ("debug", {"log_verbose_level": 1, "log_info": True, "log_warning": True, "log_error": True}),
    ("info", {"log_verbose_level": 0, "log_info": True, "log_warning": True, "log_error": True}),
    ("warning", {"log_verbose_level": 0, "log_info": False, "log_warning": True, "log_error": True}),
    ("error", {"log_verbose_level": 0, "log_info": False, "log_warning": False, "log_error": True}),
])
def test_log_level_gives_the_settings_at_start(level: str, expected: dict[str, object]) -> None:
    assert LogSettings(level).current() == {"log_file": "", "log_format": "default", **expected}


def test_each_setting_lets_its_lines_out() -> None:
    settings = LogSettings("info", refusal=None)
    logger, out = logger_with(settings)
    settings.update({"log_warning": False})  # a gap: INFO and ERROR out, WARNING not
    write_each_level(logger)
    lines = out.getvalue()
    assert "INFO" in lines and "ERROR" in lines and "CRITICAL" in lines
    assert "line at WARNING" not in lines and "line at DEBUG" not in lines
    settings.update({"log_verbose_level": 3, "log_info": False, "log_error": False, "log_format": "ISO8601"})
    assert logger.level == logging.DEBUG
    out.seek(0)
    out.truncate()
    write_each_level(logger)
    lines = out.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["line at DEBUG", "line at CRITICAL"]  # critical: always
    assert lines[0].split(" ")[0].endswith("Z") and "T" in lines[0].split(" ")[0]  # ISO8601, UTC


def test_updates_refused_without_the_flag_or_under_workers() -> None:
    assert update_refusal(False, 1) == UPDATES_OFF and update_refusal(True, 1) is None
    assert "--workers" in (update_refusal(True, 4) or "")
    settings = LogSettings("info")
    with pytest.raises(ModelhostError, match="--logging-updates") as info:
        settings.update({"log_info": False})
    assert info.value.kind is ErrorKind.UNSUPPORTED
    assert settings.update({"log_info": True, "log_format": None}) == settings.current()  # no change: allowed
