"""The Ed25519 keys access tokens are signed with, and the JWKS protected sites verify them against.

Keys live in the database; each process reads them at most every WR_KEY_CACHE_SECONDS, and at once (at
most once a second) when a token names a key it has not loaded yet (a rotation). A new key is published
`WR_KEY_PUBLISH_LEAD` before it signs, so sites that cache the JWKS know it in time; old keys retire once
the last token they signed has expired.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone
from jwt.algorithms import OKPAlgorithm

from .models import Queue, SigningKey

ACCESS_ALGORITHM = "EdDSA"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _KeyRing:
    signing_kid: str
    signing_key: Ed25519PrivateKey
    public: dict[str, Ed25519PublicKey]
    jwks: list[dict[str, Any]]
    loaded_at: float


class _KeyCache:
    """Keys are read from the database at most every WR_KEY_CACHE_SECONDS per process, and at once
    (at most once a second) when a token names a key this process has not loaded yet (a rotation)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reloading = threading.Lock()
        self._ring: _KeyRing | None = None

    def get(self, *, kid: str | None = None) -> _KeyRing:
        ring = self._ring
        if self._needs_load(ring, kid):
            if _on_event_loop():
                # The web server's event loop never waits on the database (Django forbids it there): it
                # signs with the keys it has while a thread reloads them, or, with none yet, says so.
                if ring is None:
                    raise KeysNotLoaded
                self._reload_soon()
                return ring
            with self._lock:
                # Checked again under the lock: the thread that held it may have just loaded the keys.
                ring = self._ring
                if self._needs_load(ring, kid):
                    ring = self._ring = _load_key_ring()
        assert ring is not None
        return ring

    @staticmethod
    def _needs_load(ring: _KeyRing | None, kid: str | None) -> bool:
        if ring is None:
            return True
        age = time.monotonic() - ring.loaded_at
        stale = age > settings.WR_KEY_CACHE_SECONDS
        unknown = kid is not None and kid not in ring.public
        return stale or (unknown and age > 1)

    def reset(self) -> None:
        self._ring = None

    def _reload_soon(self) -> None:
        if self._reloading.acquire(blocking=False):
            threading.Thread(target=self._reload, name="signing-keys", daemon=True).start()

    def _reload(self) -> None:
        try:
            with self._lock:
                self._ring = _load_key_ring()
        except Exception:  # the keys it has stay in use; the next stale read tries again
            logger.exception("Reloading the signing keys failed")
        finally:
            connection.close()
            self._reloading.release()


class KeysNotLoaded(Exception):
    """Asked on an event loop before this process loaded its signing keys (the web server loads them as it
    starts: fastpath's lifespan); the caller takes the synchronous path."""


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_keys = _KeyCache()


def signing_keys_reset_cache() -> None:
    _keys.reset()


def _new_signing_key(*, signs_from: datetime) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    kid = uuid.uuid4().hex[:16]
    jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
    jwk.update({"kid": kid, "alg": ACCESS_ALGORITHM, "use": "sig"})
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return SigningKey.objects.create(kid=kid, private_key_pem=pem, public_jwk=jwk, signs_from=signs_from)


def _published(now: datetime) -> Any:
    return SigningKey.objects.filter(Q(retires_at__isnull=True) | Q(retires_at__gt=now))


def _load_key_ring() -> _KeyRing:
    now = timezone.now()
    keys = list(_published(now))
    signers = [k for k in keys if k.signs_from <= now]
    if not signers:
        with transaction.atomic():
            # First start: nobody caches our JWKS yet, so the first key signs at once.
            if not _published(now).filter(signs_from__lte=now).exists():
                _new_signing_key(signs_from=now)
        keys = list(_published(now))
        signers = [k for k in keys if k.signs_from <= now]
    signer = max(signers, key=lambda k: k.signs_from)
    private = serialization.load_pem_private_key(signer.private_key_pem.encode(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    public = {}
    for key in keys:
        loaded = OKPAlgorithm.from_jwk(key.public_jwk)
        assert isinstance(loaded, Ed25519PublicKey)
        public[key.kid] = loaded
    return _KeyRing(
        signing_kid=signer.kid,
        signing_key=private,
        public=public,
        jwks=[k.public_jwk for k in keys],
        loaded_at=time.monotonic(),
    )


def signing_key_rotate(*, lead: timedelta | None = None) -> SigningKey:
    """Publish a new key that signs after `lead`; older keys retire once their last token expired."""
    now = timezone.now()
    lead = settings.WR_KEY_PUBLISH_LEAD if lead is None else lead
    longest_session = Queue.objects.aggregate(m=Max("session_ttl"))["m"] or 3600
    with transaction.atomic():
        new = _new_signing_key(signs_from=now + lead)
        retire_at = new.signs_from + timedelta(seconds=longest_session + 60)
        SigningKey.objects.filter(retires_at__isnull=True).exclude(pk=new.pk).update(retires_at=retire_at)
    signing_keys_reset_cache()
    return new


def signing_keys_prune() -> int:
    """Delete keys retired for a day (kept that long for forensics)."""
    deleted, _ = SigningKey.objects.filter(retires_at__lt=timezone.now() - timedelta(days=1)).delete()
    return deleted


def jwks() -> dict[str, Any]:
    return {"keys": _keys.get().jwks}


def key_ring(*, kid: str | None = None) -> _KeyRing:
    """The keys as this process knows them (reloaded when stale, or when `kid` is one it has not seen)."""
    return _keys.get(kid=kid)
