"""How every broker-failover process writes its log: one format and one level, from one place.

The operator, the broker, the simulators and the validator's driver all call
:func:`configure_logging` with a :class:`LogSettings` read from ``--log-format`` /
``--log-level`` or, without the flag, ``BROKER_FAILOVER_LOG_FORMAT`` (``text``, the default, or
``json``) and ``BROKER_FAILOVER_LOG_LEVEL`` (``DEBUG``, ``INFO``, the default, ``WARNING`` or
``ERROR``); :func:`parse_log_settings` turns a wrong value into a :class:`LogSettingsError`
that names the flag, the variable and the value, which each entrypoint reports as its other
settings errors (exit 2). The operator passes its own two values to the broker pods it makes, so
one setting (the chart's ``logging``) covers the whole install.

``json`` writes one object per line, for log pipelines (Loki, Fluent Bit, Vector, Cloud
Logging)::

    {"time":"2026-11-28T15:11:44.948222Z","level":"INFO","logger":"broker_service.lifecycle",
    "message":"activated with epoch 1 (1 streams known from the backend; both targets told in 3 ms)"}

(one line, wrapped here). ``time`` is RFC 3339 in UTC with microseconds (as the message log's
``ts``); ``exception`` (the traceback, as the text format prints it) and ``stack`` appear only
when the record has one.
Fields a caller passes with ``extra=`` follow when they are JSON scalars or flat mappings of
scalars (kopf's object reference is one); anything else is left out, since its ``repr`` is
unbounded and may hold a credential (kopf passes its whole ``OperatorSettings`` on each record).
``extra_names`` renames or drops a library's fields (the operator maps kopf's ``k8s_ref`` to
``object``, the key kopf's own JSON uses).

What protects a line from credentials is unchanged: :mod:`broker_contracts.redact` is applied
where text is made from credential-bearing input (docs/security.md), and ``message`` and
``exception`` here are exactly what the text format prints. The one thing JSON shows that text
never did, the ``extra`` fields, passes through :func:`~broker_contracts.redact.redact` here.

Every line is bounded: the container runtime splits a log line over 16 KiB into partial lines
(containerd's ``max_container_log_line_size``), which a pipeline then sees as broken JSON; a
record that would exceed :data:`MAX_LINE_CHARS` keeps the head of its message and the tail of its
traceback (where the exception that was raised is) and says ``"truncated": true``. Lines are
ASCII (``\\uXXXX`` escapes), so no splitter that treats U+2028 or a stray byte as a line end can
cut an object in two. In ``json`` mode Python's warnings and uncaught exceptions are logged too,
so that nothing the process writes to stderr is left outside the format (errors in the flags
themselves are reported before logging is configured, as plain text, with exit code 2).

Why the standard library and not python-json-logger (which kopf uses and so the operator's image
already has): the whole formatter is a ``json.dumps`` of five fields, the broker's, simulators'
and validator's images would gain a dependency for it, and the fields, the bound and the
handling of ``extra`` are ours to define either way.

What this module does not do: the text format stays as it was
(``%(asctime)s %(levelname)s %(name)s: %(message)s``, not truncated); it configures no Java
logging (Spark's log4j, in the validator's JVM, writes its own lines) and no per-logger levels
(the operator's kopf bridge is ``broker_operator/kopf_logging.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Final, TextIO

from broker_contracts.environment import BROKER_FAILOVER_LOG_FORMAT, BROKER_FAILOVER_LOG_LEVEL
from broker_contracts.redact import redact

FORMAT_FLAG: Final = "--log-format"
LEVEL_FLAG: Final = "--log-level"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The levels a person may choose; CRITICAL is what uncaught exceptions are logged at, always shown.
LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
# Under containerd's and Docker's 16 KiB line limit, with room for the newline.
MAX_LINE_CHARS: Final = 16000
MAX_EXTRA_KEYS: Final = 16  # in one mapping passed with extra=; a larger one is left out
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_SHOWN_VALUE_CHARS: Final = 40  # of a wrong setting, in its error
_TRUNCATED_MARK: Final = " [...]"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogSettingsError(ValueError):
    """A log format or level that cannot be used; the text names the flag, its variable and the value."""


@dataclass(frozen=True)
class LogSettings:
    format: LogFormat = LogFormat.TEXT
    level: str = "INFO"  # one of LEVELS

    @property
    def level_number(self) -> int:
        return logging.getLevelNamesMapping()[self.level]

    def environment(self) -> dict[str, str]:
        """The two variables that give another process these settings (the operator's broker pods)."""
        return {BROKER_FAILOVER_LOG_FORMAT: self.format.value, BROKER_FAILOVER_LOG_LEVEL: self.level}


DEFAULT_LOG_SETTINGS: Final = LogSettings()


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS] + "...")


def parse_log_settings(format_text: str | None, level_text: str | None) -> LogSettings:
    """Settings from the two values as given (None or blank: the default); case does not matter."""
    format_value = (format_text or "").strip().lower() or LogFormat.TEXT.value
    level_value = (level_text or "").strip().upper() or "INFO"
    if format_value not in {member.value for member in LogFormat}:
        raise LogSettingsError(
            f"{FORMAT_FLAG} / {BROKER_FAILOVER_LOG_FORMAT} = {_shown(format_text or '')}: "
            f"use one of {', '.join(member.value for member in LogFormat)}"
        )
    if level_value not in LEVELS:
        raise LogSettingsError(
            f"{LEVEL_FLAG} / {BROKER_FAILOVER_LOG_LEVEL} = {_shown(level_text or '')}: "
            f"use one of {', '.join(LEVELS)}"
        )
    return LogSettings(LogFormat(format_value), level_value)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level``, for a CLI that reads them with :func:`log_settings_from`."""
    parser.add_argument(
        FORMAT_FLAG,
        default=None,
        metavar="text|json",
        help=f"log line format (env {BROKER_FAILOVER_LOG_FORMAT}; default text)",
    )
    parser.add_argument(
        LEVEL_FLAG,
        default=None,
        metavar="|".join(LEVELS),
        help=f"least severe level logged (env {BROKER_FAILOVER_LOG_LEVEL}; default INFO)",
    )


def log_settings_from(
    parser: argparse.ArgumentParser, args: argparse.Namespace, environ: Mapping[str, str]
) -> LogSettings:
    """The flags :func:`add_log_arguments` added to ``parser``, each over its variable; a wrong
    value is the parser's usage error (exit 2), as a wrong value of any other flag is."""
    try:
        return parse_log_settings(
            args.log_format if args.log_format is not None else environ.get(BROKER_FAILOVER_LOG_FORMAT),
            args.log_level if args.log_level is not None else environ.get(BROKER_FAILOVER_LOG_LEVEL),
        )
    except LogSettingsError as error:
        parser.error(str(error))


# Every attribute a LogRecord has without extra= (and the two Formatter.format adds): the rest is extra.
_RECORD_ATTRIBUTES: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
_CORE_FIELDS: Final = ("time", "level", "logger", "message", "exception", "stack", "truncated")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one ASCII line of at most :data:`MAX_LINE_CHARS`."""

    def __init__(self, extra_names: Mapping[str, str | None] | None = None) -> None:
        super().__init__()
        self.extra_names = dict(extra_names or {})

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).strftime(_TIME_FORMAT),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)  # cached, as Formatter.format does
        if record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        extras = self._extras(record)
        line = _encode({**fields, **extras})
        budget = MAX_LINE_CHARS
        while len(line) > MAX_LINE_CHARS and budget >= 64:
            # Halving converges even for text that escaping makes twelve times longer (lone surrogates).
            line = _encode(_shortened(fields, budget))
            budget //= 2
        return line

    def _extras(self, record: logging.LogRecord) -> dict[str, object]:
        extras: dict[str, object] = {}
        for attribute, value in vars(record).items():
            if attribute in _RECORD_ATTRIBUTES:
                continue
            name = self.extra_names.get(attribute, attribute)
            if name is None or name in _CORE_FIELDS:
                continue
            shown = _json_value(value)
            if shown is not _LEFT_OUT:
                extras[name] = shown
        return extras


_LEFT_OUT: Final = object()


def _scalar(value: object) -> object:
    if isinstance(value, str):
        return redact(value)  # never passed a redaction boundary: text never printed extras
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and infinities are not JSON
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _LEFT_OUT


def _json_value(value: object) -> object:
    """``value`` as a JSON field: a scalar, or a flat mapping of scalars; else :data:`_LEFT_OUT`."""
    if isinstance(value, Mapping):
        if len(value) > MAX_EXTRA_KEYS:
            return _LEFT_OUT
        shown = {key: _scalar(item) for key, item in value.items() if isinstance(key, str)}
        return {key: item for key, item in shown.items() if item is not _LEFT_OUT}
    return _scalar(value)


def _encode(fields: Mapping[str, object]) -> str:
    # ensure_ascii: no character in a line that any reader could take for a line end.
    return json.dumps(fields, ensure_ascii=True, separators=(",", ":"))


def _shortened(fields: Mapping[str, object], budget: int) -> dict[str, object]:
    """The core fields only (no extras), the message cut to its head and the traceback to its tail
    (where the exception raised is), in about ``budget`` characters before escaping."""
    short = {key: fields[key] for key in ("time", "level", "logger")}
    short["message"] = _head(str(fields["message"]), budget // 4)
    for key in ("exception", "stack"):
        if key in fields:
            short[key] = _tail(str(fields[key]), budget // 2)
    short["truncated"] = True
    return short


def _head(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + _TRUNCATED_MARK


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else _TRUNCATED_MARK.strip() + "\n" + text[-chars:]


class _ConfiguredHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs, told apart so that a second call replaces it
    (and leaves alone any other, such as pytest's capture)."""


def configure_logging(
    settings: LogSettings,
    *,
    stream: TextIO | None = None,
    extra_names: Mapping[str, str | None] | None = None,
) -> None:
    """Send every logger's records at ``settings.level`` and above to ``stream`` (stderr) in
    ``settings.format``. The level is on the root logger (records below it are not even made) and on
    the handler (a logger given a lower level of its own still stays off stderr)."""
    handler = _ConfiguredHandler(stream if stream is not None else sys.stderr)
    handler.setLevel(settings.level_number)
    if settings.format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter(extra_names))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for previous in [h for h in root.handlers if isinstance(h, _ConfiguredHandler)]:
        root.removeHandler(previous)
    root.addHandler(handler)
    root.setLevel(settings.level_number)
    if settings.format is LogFormat.JSON:
        _log_what_would_bypass_the_format()


def _log_what_would_bypass_the_format() -> None:
    """Warnings and uncaught exceptions as records, not as free text on stderr among JSON lines."""
    logging.captureWarnings(True)

    def log_uncaught(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, error, trace)
            return
        logging.getLogger("uncaught").critical("uncaught exception", exc_info=(kind, error, trace))

    def log_uncaught_in_thread(hook: threading.ExceptHookArgs) -> None:
        if hook.exc_value is None or issubclass(hook.exc_type, SystemExit):
            return  # as threading's own hook: a thread's SystemExit is silent
        name = hook.thread.name if hook.thread is not None else "?"
        trace = (hook.exc_type, hook.exc_value, hook.exc_traceback)
        logging.getLogger("uncaught").critical("uncaught exception in thread %s", name, exc_info=trace)

    sys.excepthook = log_uncaught
    threading.excepthook = log_uncaught_in_thread
