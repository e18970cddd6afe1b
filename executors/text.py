"""Text that users control, made safe to show where an operator reads it: a terminal, a log.

A job's name, a Slurm comment, a replica's metrics page or a program's error message may hold
control characters: escape sequences that retitle or rewrite a terminal, carriage returns and
newlines that forge a line (in a log: a whole record, with its level and logger), bidirectional
overrides that reorder what is shown. Each is shown escaped (``\\x1b``) instead.
"""

from __future__ import annotations

import logging


def printable(text: object) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\u202e``); the rest as it is."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


class SafeFormatter(logging.Formatter):
    """A formatter whose records are one line each, whatever their arguments hold: the message is escaped with
    :func:`printable`, and an exception's traceback (its lines are the formatter's own) is indented, its
    characters escaped line by line, so nothing in it can start a line that reads as a record."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return "\n".join("    " + printable(line) for line in super().formatException(ei).splitlines())

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return "\n".join("    " + printable(line) for line in super().formatStack(stack_info).splitlines())


def configure_logging(level: int, fmt: str) -> None:
    """``logging.basicConfig`` with a :class:`SafeFormatter` on the handler it makes (stderr); handlers that were
    there already (a host process's) are left as they are."""
    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=level, format=fmt)
    for handler in root.handlers:
        if handler not in before:
            handler.setFormatter(SafeFormatter(fmt))
