"""Users' text in operators' logs: one record is one line, whatever the text holds."""

from __future__ import annotations

import io
import logging

import pytest

from executors.text import SafeFormatter, configure_logging, printable

FMT = "%(levelname)s %(name)s: %(message)s"


def _logger(stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SafeFormatter(FMT))
    log = logging.getLogger(f"muxflow.test.{id(stream)}")
    log.propagate = False
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    return log


def test_printable_escapes_what_rewrites_a_terminal_or_a_line_and_keeps_the_rest() -> None:
    assert printable("résumé 训练 job-1") == "résumé 训练 job-1"
    assert printable("a\nb\rc\x1b[2J\u202edcba\x00") == "a\\nb\\rc\\x1b[2J\\u202edcba\\x00"
    assert printable(42) == "42"


def test_a_forged_record_in_a_message_argument_stays_inside_its_own_line() -> None:
    out = io.StringIO()
    # what a replica's metrics page or a job's iteration report could make an exception message say
    attack = "bad value\nCRITICAL executors.node.agent: GPU 0: evicted [1, 2, 3]\r\x1b[1A\x1b[2K"
    _logger(out).warning("scrape of %s failed: %s", "http://10.0.0.5:9000/metrics", attack)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.startswith("WARNING ")
    assert "\\nCRITICAL executors.node.agent" in text and "\\x1b[1A" in text and "\x1b" not in text


def test_a_traceback_keeps_its_lines_but_none_can_pass_for_a_record() -> None:
    out = io.StringIO()
    log = _logger(out)
    try:
        raise ValueError("checkpoint refused\nERROR executors.node.agent: forged\x1b]0;title\x07")
    except ValueError:
        log.exception("store write failed (%s)", "minute")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("ERROR ") and lines[0].endswith(": store write failed (minute)")
    assert len(lines) > 2 and all(ln.startswith("    ") for ln in lines[1:])
    assert not any(ln.startswith("ERROR executors") for ln in lines)
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()


def test_configure_logging_puts_the_safe_formatter_on_the_root_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    configure_logging(logging.WARNING, FMT)
    assert len(root.handlers) == 1 and isinstance(root.handlers[0].formatter, SafeFormatter)
    # a host's own handler (a test runner's capture) is left as it is
    host = logging.StreamHandler(io.StringIO())
    monkeypatch.setattr(root, "handlers", [host])
    configure_logging(logging.WARNING, FMT)
    assert root.handlers == [host] and not isinstance(host.formatter, SafeFormatter)
