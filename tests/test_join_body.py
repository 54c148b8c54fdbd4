"""The join body's rules are written once (serializers.JOIN_FIELDS, issue 49): the schema's serializer and
the check every join runs agree on every body, whether it is taken and which fields are blamed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.api import serializers as s
from queueing.api.errors import ApiError

NAMES = [name for name, _, _ in s.JOIN_FIELDS]
# Text near each field's limit, with what DRF's CharField refuses besides length (NUL, lone surrogates).
TEXT = st.one_of(
    st.text(max_size=8),
    st.integers(0, 2).flatmap(lambda pad: st.sampled_from([40, 64, 200]).map(lambda n: "x" * (n - 1 + pad))),
    st.sampled_from(["", "  ", "a\x00b", "\ud800", "Zoë 🎟"]),
)
VALUE = st.one_of(TEXT, st.none(), st.integers(), st.booleans(), st.lists(st.text(max_size=2), max_size=2))
BODY = st.one_of(
    st.dictionaries(st.sampled_from([*NAMES, "other", "seat"]), VALUE, max_size=5),
    st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)),
)


def _blamed_by_the_check(body: Any) -> set[str] | None:
    try:
        s.join_request_validate(body)
    except ApiError as exc:
        fields = exc.extra.get("fields", {})
        return set(fields)
    return None


@settings(max_examples=400, deadline=None)
@given(BODY)
def test_the_schema_s_serializer_and_the_join_s_check_agree_on_every_body(body):
    serializer = s.JoinRequestSerializer(data=body)
    taken = serializer.is_valid()
    blamed = _blamed_by_the_check(body)
    assert taken == (blamed is None), (body, serializer.errors, blamed)
    if not taken:
        assert set(serializer.errors) == blamed, (body, serializer.errors, blamed)
        return
    checked = s.join_request_validate(body)
    assert {name: value for name, value in checked.items() if name in body} == {
        name: value if name != "display_name" else checked[name] for name, value in serializer.validated_data.items()
    }


def test_the_schema_describes_each_field_of_the_body_with_its_limit():
    fields = s.JoinRequestSerializer().fields
    assert [(name, field.max_length) for name, field in fields.items()] == [(n, m) for n, m, _ in s.JOIN_FIELDS]
