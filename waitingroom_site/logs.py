"""Log lines (README "Logs"): one JSON object per line in production (LOG_FORMAT=json, the default), for
the operator's log search; readable text in `bin/run` (LOG_FORMAT=text). Every line carries the request id,
queue and ticket of the request or task it belongs to (queueing/logcontext.py), when it has them."""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from queueing import logcontext

TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonLines(JsonFormatter):
    """{"time", "level", "logger", "message", "request_id", "queue", "ticket", ...}: the context fields only
    when set, and whatever a call passed as `extra`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("rename_fields", {"asctime": "time", "levelname": "level", "name": "logger"})
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s", *args, **kwargs)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        for name in logcontext.FIELDS:
            if not log_data.get(name):
                log_data.pop(name, None)


class Text(logging.Formatter):
    """TEXT, and the context fields that are set, at the end: `… [request_id=… queue=demo]`."""

    def __init__(self) -> None:
        super().__init__(TEXT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        said = " ".join(f"{name}={value}" for name in logcontext.FIELDS if (value := getattr(record, name, "")))
        return f"{line} [{said}]" if said else line
