"""The shared log configuration (broker_contracts.logs): settings, the JSON lines, their bounds.

Each test configures the real root logger into a StringIO and reads back what a pipeline would:
every line must parse as one JSON object with the documented fields, at the chosen level and up,
within the line bound, and showing no credential the text format would not show.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import threading
import warnings
from datetime import UTC, datetime, timedelta

import pytest

from broker_contracts import logs
from broker_contracts.logs import (
    MAX_LINE_CHARS,
    LogFormat,
    LogSettings,
    LogSettingsError,
    configure_logging,
    parse_log_settings,
)

SECRET = "S3cret-logs-9c1f7a"


pytestmark = pytest.mark.usefixtures("restored_logging")  # tests/unit/conftest.py


def configured(format: str = "json", level: str = "INFO", **options: object) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(parse_log_settings(format, level), stream=stream, **options)  # type: ignore[arg-type]
    return stream


def lines_of(stream: io.StringIO) -> list[dict[str, object]]:
    text = stream.getvalue()
    assert text.endswith("\n") or not text
    objects = [json.loads(line) for line in text.split("\n") if line]
    assert all(isinstance(obj, dict) for obj in objects)
    return objects


# Settings


def test_the_defaults_are_text_at_info_and_case_and_blanks_do_not_matter() -> None:
    assert parse_log_settings(None, None) == LogSettings(LogFormat.TEXT, "INFO")
    assert parse_log_settings("", "  ") == LogSettings(LogFormat.TEXT, "INFO")
    assert parse_log_settings(" JSON ", "debug") == LogSettings(LogFormat.JSON, "DEBUG")
    assert parse_log_settings("text", "Warning").level_number == logging.WARNING


@pytest.mark.parametrize(
    ("format", "level", "named"),
    [
        ("yaml", None, "--log-format / BROKER_FAILOVER_LOG_FORMAT = 'yaml': use one of text, json"),
        (None, "verbose", "--log-level / BROKER_FAILOVER_LOG_LEVEL = 'verbose': use one of DEBUG, INFO"),
        (None, "CRITICAL", "'CRITICAL': use one of DEBUG, INFO, WARNING, ERROR"),
        (None, "WARN", "'WARN'"),
    ],
)
def test_a_wrong_value_is_refused_naming_the_flag_the_variable_and_the_value(
    format: str | None, level: str | None, named: str
) -> None:
    with pytest.raises(LogSettingsError) as refused:
        parse_log_settings(format, level)
    assert named in str(refused.value)


def test_a_long_wrong_value_is_shown_cut_short() -> None:
    with pytest.raises(LogSettingsError) as refused:
        parse_log_settings("x" * 10_000, None)
    assert len(str(refused.value)) < 200


def test_a_flag_wins_over_its_variable_and_a_wrong_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="some-cli")
    logs.add_log_arguments(parser)
    environ = {"BROKER_FAILOVER_LOG_FORMAT": "json", "BROKER_FAILOVER_LOG_LEVEL": "ERROR"}
    from_env = logs.log_settings_from(parser, parser.parse_args([]), environ)
    assert from_env == LogSettings(LogFormat.JSON, "ERROR")
    flagged = parser.parse_args(["--log-format", "text", "--log-level", "DEBUG"])
    assert logs.log_settings_from(parser, flagged, environ) == LogSettings(LogFormat.TEXT, "DEBUG")
    with pytest.raises(SystemExit) as stopped:
        logs.log_settings_from(parser, parser.parse_args([]), {"BROKER_FAILOVER_LOG_LEVEL": "loud"})
    assert stopped.value.code == 2
    assert "BROKER_FAILOVER_LOG_LEVEL = 'loud'" in capsys.readouterr().err


def test_the_settings_give_a_pod_the_same_two_variables() -> None:
    assert LogSettings(LogFormat.JSON, "WARNING").environment() == {
        "BROKER_FAILOVER_LOG_FORMAT": "json",
        "BROKER_FAILOVER_LOG_LEVEL": "WARNING",
    }


# JSON lines


def test_each_record_is_one_json_object_with_time_level_logger_and_message() -> None:
    stream = configured()
    before = datetime.now(UTC)
    logging.getLogger("broker_service.term").info("activated at epoch %d", 3)
    logging.getLogger("other").warning("two\nlines and a \u2028 separator")
    (first, second) = lines_of(stream)
    assert list(first) == ["time", "level", "logger", "message"]
    assert first["level"] == "INFO" and first["logger"] == "broker_service.term"
    assert first["message"] == "activated at epoch 3"
    time = str(first["time"])
    assert time.endswith("Z")  # RFC 3339, UTC
    moment = datetime.strptime(time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert before - timedelta(seconds=1) <= moment <= datetime.now(UTC) + timedelta(seconds=1)
    # Still one line each, in ASCII: no reader can split an object at a line end.
    assert second["message"] == "two\nlines and a \u2028 separator"
    assert len(stream.getvalue().splitlines()) == 2
    assert stream.getvalue().isascii()


def test_an_exception_comes_as_the_text_formats_traceback() -> None:
    stream = configured()
    try:
        _ = 1 / 0
    except ZeroDivisionError:
        logging.getLogger("broker_service.journal").exception("journal cannot be used")
    (line,) = lines_of(stream)
    assert line["level"] == "ERROR" and line["message"] == "journal cannot be used"
    exception = str(line["exception"])
    assert exception.startswith("Traceback (most recent call last):")
    assert exception.endswith("ZeroDivisionError: division by zero")


def test_records_below_the_level_are_left_out_and_the_rest_kept() -> None:
    stream = configured(level="WARNING")
    log = logging.getLogger("broker_service.outbound")
    log.debug("debug")
    log.info("info")
    log.warning("warning")
    log.error("error")
    assert [line["message"] for line in lines_of(stream)] == ["warning", "error"]
    stream = configured(level="DEBUG")
    log.debug("debug")
    assert [line["level"] for line in lines_of(stream)] == ["DEBUG"]


def test_text_stays_the_format_it_was() -> None:
    stream = configured(format="text")
    logging.getLogger("broker_service").info("event loop: %s", "uvloop")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" INFO broker_service: event loop: uvloop")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_a_second_configuration_replaces_the_first_and_keeps_other_handlers() -> None:
    other = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(other)
    first = configured(format="text")
    second = configured(format="json")
    logging.getLogger("x").warning("once")
    assert first.getvalue() == "" and len(lines_of(second)) == 1
    assert other in logging.getLogger().handlers


def test_a_long_record_is_cut_to_one_line_under_the_bound_keeping_the_tracebacks_end() -> None:
    stream = configured()
    try:
        raise ValueError("the reason at the end " + "y" * 50_000)
    except ValueError:
        logging.getLogger("x").exception("head of the message " + "x" * 100_000, extra={"big": "z" * 40_000})
    raw = stream.getvalue()
    assert len(raw.rstrip("\n")) <= MAX_LINE_CHARS and raw.count("\n") == 1
    (line,) = lines_of(stream)
    assert line["truncated"] is True
    assert str(line["message"]).startswith("head of the message x")
    assert str(line["exception"]).endswith("y" * 100)  # the raised exception's message, its end
    assert "big" not in line


def test_text_that_escaping_makes_much_longer_is_still_bounded() -> None:
    stream = configured()
    logging.getLogger("x").warning("\x01" * 20_000 + "\ud800" * 20_000)  # \u0001 and lone surrogates
    raw = stream.getvalue()
    assert len(raw.rstrip("\n")) <= MAX_LINE_CHARS
    assert lines_of(stream)[0]["truncated"] is True


# extra= fields and credentials


class Holder:
    """An object with a credential in its repr, as kopf's OperatorSettings on every object record."""

    def __repr__(self) -> str:
        return f"Holder(token={SECRET!r})"


def test_simple_extras_follow_and_anything_else_is_left_out() -> None:
    stream = configured()
    logging.getLogger("x").info(
        "with extras",
        extra={
            "cluster": "orders",
            "epoch": 4,
            "lease": 2.5,
            "active": True,
            "nothing": None,
            "ratio": float("nan"),
            "ref": {"kind": "Pod", "name": "orders-0", "nested": {"no": 1}},
            "holder": Holder(),
            "items": [SECRET],
            "wide": {str(n): n for n in range(logs.MAX_EXTRA_KEYS + 1)},
        },
    )
    (line,) = lines_of(stream)
    assert line["cluster"] == "orders" and line["epoch"] == 4 and line["lease"] == 2.5
    assert line["active"] is True and line["nothing"] is None and line["ratio"] == "nan"
    assert line["ref"] == {"kind": "Pod", "name": "orders-0"}
    assert not {"holder", "items", "wide"} & set(line)
    assert SECRET not in stream.getvalue()


def test_extra_names_rename_or_drop_a_librarys_fields_and_never_shadow_the_core_ones() -> None:
    stream = configured(extra_names={"k8s_ref": "object", "k8s_skip": None, "level2": "level"})
    logging.getLogger("kopf.objects").info(
        "Handler succeeded.", extra={"k8s_ref": {"name": "orders"}, "k8s_skip": False, "level2": "x"}
    )
    (line,) = lines_of(stream)
    assert line["object"] == {"name": "orders"} and line["level"] == "INFO"
    assert "k8s_ref" not in line and "k8s_skip" not in line


def test_json_shows_no_credential_that_the_text_format_does_not() -> None:
    # The text format prints the message and the traceback, never extras; so the credential
    # boundary (broker_contracts.redact, where error text is made) covers both formats, and an
    # extra is redacted here, since no boundary has seen it.
    url = f"https://erp-user:{SECRET}@erp.example/api?sig={SECRET}"
    extras = {"url": url, "header": f"Bearer {SECRET}", "holder": Holder(), "ref": {"url": url}}

    def log_everything() -> None:
        try:
            raise RuntimeError("cannot connect to erp.example (redacted where it was made)")
        except RuntimeError:
            logging.getLogger("broker_service.relay_client").exception(
                "relay failed: %s", "https://erp.example/api?sig=***", extra=extras
            )

    text = configured(format="text")
    log_everything()
    json_stream = configured(format="json")
    log_everything()
    assert SECRET not in text.getvalue() and SECRET not in json_stream.getvalue()
    (line,) = lines_of(json_stream)
    assert str(line["url"]).startswith("https://***@erp.example/api?sig=***")
    assert line["header"] == "Bearer ***" and line["ref"] == {"url": line["url"]}
    # And what the text format shows, the JSON shows as it is: the same message and traceback.
    assert f"{line['message']}\n{line['exception']}" in text.getvalue()


# What would otherwise bypass the format


def test_in_json_warnings_and_uncaught_exceptions_are_records_too() -> None:
    stream = configured()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated thing", DeprecationWarning, stacklevel=1)
    try:
        raise KeyError("lost")
    except KeyError:
        sys.excepthook(*sys.exc_info())  # what the interpreter calls for an uncaught exception
    thread = threading.Thread(target=lambda: 1 / 0, name="worker")
    thread.start()
    thread.join()
    warned, uncaught, in_thread = lines_of(stream)
    assert warned["logger"] == "py.warnings" and "a deprecated thing" in str(warned["message"])
    assert (uncaught["level"], uncaught["logger"]) == ("CRITICAL", "uncaught")
    assert str(uncaught["exception"]).endswith("KeyError: 'lost'")
    assert in_thread["message"] == "uncaught exception in thread worker"
    assert str(in_thread["exception"]).endswith("ZeroDivisionError: division by zero")
