"""Reading a script's reply array into named, typed fields: one reply type per script (next to the wrapper
that runs it), its fields in the order the script's header lists them.

A reply type is a frozen dataclass deriving from `Reply`; each value is converted by its field's annotated
type (str, int, float, bool as Redis returns them), or by the type's `CONVERT` entry for that field (a
nested reply, an optional value). A reply with a field too many or too few is refused (ValueError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Self, get_type_hints


def text(value: Any) -> str:
    return "" if value is None else str(value)


def flag(value: Any) -> bool:
    """0 | 1 as Lua returns a boolean."""
    return bool(int(value))


def whole(value: Any) -> int:
    """An integer Redis may have stored as a float ('1.7e12')."""
    return int(float(value))


def texts(value: Any) -> list[str]:
    """A list of ids (ticket ids) as texts."""
    return [str(t) for t in value]


def optional(value: Any) -> int | None:
    """A count or an estimate, -1 when there is none."""
    number = int(value)
    return number if number >= 0 else None


BY_TYPE: dict[Any, Callable[[Any], Any]] = {str: text, int: int, float: float, bool: flag}


_converters: dict[type, tuple[Callable[[Any], Any], ...]] = {}
_names: dict[type, tuple[str, ...]] = {}
_parsers: dict[type, Callable[[Sequence[Any]], Any]] = {}


def converters_of(cls: type) -> tuple[Callable[[Any], Any], ...]:
    """Each field's converter, in the fields' order (worked out once per reply type)."""
    found = _converters.get(cls)
    if found is None:
        hints = get_type_hints(cls)
        convert: dict[str, Callable[[Any], Any]] = getattr(cls, "CONVERT", {})
        fields = dataclasses.fields(cls)
        found = _converters[cls] = tuple(convert.get(f.name) or BY_TYPE[hints[f.name]] for f in fields)
        _names[cls] = tuple(f.name for f in fields)
    return found


def _parser(cls: type) -> Callable[[Sequence[Any]], Any]:
    """A function that reads a reply of this type, written out once per type: each field set from its
    converter and its place, in one dict (a generic loop over the fields, a call per field to apply its
    converter, was most of the cost of reading a poll's replies)."""
    converters = converters_of(cls)
    count = len(converters)
    fields = ", ".join(f"{name!r}: c{index}(raw[{index}])" for index, name in enumerate(_names[cls]))
    source = (
        "def parse(raw):\n"
        f"    if len(raw) != {count}:\n"
        f"        raise ValueError(f'{cls.__name__} has {count} fields; the reply has {{len(raw)}}')\n"
        "    reply = new(cls)\n"
        f"    reply.__dict__.update({{{fields}}})\n"
        "    return reply\n"
    )
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    namespace.update((f"c{index}", convert) for index, convert in enumerate(converters))
    exec(source, namespace)  # noqa: S102 (our own field names and converters, no outside text)
    parse: Callable[[Sequence[Any]], Any] = namespace["parse"]
    return parse


class Reply:
    """A script's reply (or one row of it) as named fields."""

    CONVERT: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> Self:
        # Every field is given, so the frozen dataclass's __init__ (a call to object.__setattr__ per field)
        # has nothing to add: its fields are set at once.
        parse = _parsers.get(cls)
        if parse is None:
            parse = _parsers[cls] = _parser(cls)
        reply: Self = parse(raw)
        return reply

    # A reply still reads as the array it came from: unpacked, or indexed in the script's order.
    def __iter__(self) -> Iterator[Any]:
        return (getattr(self, field.name) for field in dataclasses.fields(self))  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return tuple(self)[index]


def maybe(parse: Callable[[Sequence[Any]], Any]) -> Callable[[Any], Any]:
    """A nested reply that may be empty ({} from Lua): None then."""
    return lambda raw: parse(raw) if raw else None
