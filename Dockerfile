# The Waiting Room image: web (granian), websockets (uvicorn), worker and beat all run from it (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    WR_VAR_DIR=/app/var

WORKDIR /app
# The runtime lock: every package at its locked version, each download checked against its locked hashes.
COPY requirements.lock .
RUN pip install --require-hashes -r requirements.lock

COPY . .
# Static files are collected at build time and served by whitenoise; the key is for this step only.
RUN SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput -v 0 \
    && useradd --system --home /app waitingroom \
    && mkdir -p /app/var && chown -R waitingroom /app/var

USER waitingroom
EXPOSE 8000
CMD ["granian", "--interface", "asgi", "--http", "1", "--no-ws", "--loop", "uvloop", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", "--respawn-failed-workers", "--no-access-log", "waitingroom_site.web:application"]
