"""The API's JSON parser: DRF's, with bodies nested too deeply for Python's parser refused as malformed JSON
(400 in the error shape) instead of a RecursionError (500)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class SafeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - the body is nested too deeply.") from exc
