"""The product's name and version for page footers (`{% load product %}{% product_version %}`): a tag
rather than a context processor, so only the pages that show it ask."""

from __future__ import annotations

from django import template

from waitingroom_site.version import VERSION

register = template.Library()


@register.simple_tag
def product_version() -> str:
    return f"Waiting Room {VERSION}"
