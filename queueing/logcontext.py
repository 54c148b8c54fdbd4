"""What every log line says about the request or task it belongs to (README "Logs"): its request id, and
the queue and ticket it concerns, never a token. Context variables, so each request (a thread of the web
server's pool) and each Celery task has its own; a logging filter copies them onto every record, and the
JSON formatter writes them as fields.

    with logcontext.bound(request_id="…", queue="demo"):
        ...                                  # every line logged in here says so
    logcontext.bind(ticket="0000000042.abc") # from here to the end of the bound block
    with logcontext.about(queue="demo"):     # the queue only, the request id kept
        ...
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

FIELDS = ("request_id", "queue", "ticket")
_vars: dict[str, ContextVar[str]] = {name: ContextVar(f"wr_log_{name}", default="") for name in FIELDS}

# An X-Request-ID taken from a client or a proxy: letters, digits and . _ : - only, at most 128 characters
# (it goes into every log line and back into a response header as it is).
_GIVEN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id(given: str | None = None) -> str:
    """`given` (an X-Request-ID header) if it is a fit one, else a new id."""
    if given and _GIVEN.fullmatch(given):
        return given
    return uuid.uuid4().hex


def current(name: str) -> str:
    return _vars[name].get()


def bind(**values: str) -> None:
    """Set fields for the rest of the current context (a `bound` block, a request, a task)."""
    for name, value in values.items():
        _vars[name].set(value)


@contextmanager
def bound(**values: str) -> Iterator[None]:
    """Fields set for the block, and every field as it was before once it ends."""
    tokens: list[tuple[ContextVar[str], Token[str]]] = []
    for name, var in _vars.items():
        tokens.append((var, var.set(values.get(name, ""))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


@contextmanager
def about(**values: str) -> Iterator[None]:
    """Only the given fields set for the block (the others kept), as they were once it ends: a task's lines
    about one queue of the many it goes over."""
    tokens = [(_vars[name], _vars[name].set(value)) for name, value in values.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class ContextFilter(logging.Filter):
    """Puts the fields on every record (empty when unset), for the formatters to write."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in _vars.items():
            if not hasattr(record, name):
                setattr(record, name, var.get())
        return True
