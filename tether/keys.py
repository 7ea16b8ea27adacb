"""Keys derived from the server's secret key: one HKDF-SHA256 owner, one purpose per use.

Each use names its own salt and info string (the credentials' encryption, the receipts' signature,
the review sampling seed), so its key is unrelated to the others and to the secret itself. The
secret is `settings.SECRET_KEY`; during a rotation `secrets()` also gives the fallbacks
(`SECRET_KEY_FALLBACKS`), newest first, for what was sealed under an earlier one.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


def derive(salt: bytes, info: bytes, secret: str | None = None) -> bytes:
    """Return the 32-byte key for the purpose `salt`/`info`, from `secret` (default: `SECRET_KEY`)."""
    secret = settings.SECRET_KEY if secret is None else secret
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret.encode())


def secrets() -> list[str]:
    """Return the secret key, then its fallbacks: every secret something may have been sealed under."""
    return [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
