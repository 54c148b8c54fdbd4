from django.urls import register_converter


class QueueSlugConverter:
    regex = "[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(QueueSlugConverter, "queue")
