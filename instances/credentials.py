"""Bring-your-own-key credentials: encryption at rest, resolution per instance, scrubbing.

Touches no network. Keys are stored as Fernet tokens whose key is derived from
`settings.SECRET_KEY` with HKDF-SHA256, so the database alone never reveals a key.
Resolving the key for an instance goes: the instance's own `Credential` (owned by the
instance's owner) → the `ANTHROPIC_API_KEY` environment variable (a single-user
install) → none, in which case `ensure_usable` refuses with a message saying how to
add one. The base URL goes: the instance's `base_url` → `ANTHROPIC_BASE_URL` → Anthropic's.

Rotating the encryption key. Django's own rotation setting is honoured: decryption
tries `SECRET_KEY` and then every key in `SECRET_KEY_FALLBACKS`; encryption always uses
`SECRET_KEY`. To rotate:

1. put the new secret in `TETHER_SECRET_KEY` (or `$TETHER_HOME/secret_key`) and the old
   one in `settings.SECRET_KEY_FALLBACKS`;
2. restart, then run
   `python manage.py shell -c "from instances import credentials; print(credentials.rotate())"`
   which re-encrypts every stored key under the new secret;
3. drop the old secret from `SECRET_KEY_FALLBACKS`.

A stored key that no configured secret can decrypt (the old secret was lost) is reported
by `ensure_usable` as unusable: the user re-enters it.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

if TYPE_CHECKING:
    from instances.models import Credential, Instance

DEFAULT_BASE_URL = "https://api.anthropic.com"
ENV_KEY = "ANTHROPIC_API_KEY"
ENV_BASE_URL = "ANTHROPIC_BASE_URL"
REDACTED = "[redacted]"

_SALT = b"tether.credentials"
_INFO = b"tether credential encryption v1"


class CredentialUnreadable(ValueError):
    """A stored key that none of the configured secrets can decrypt."""


def _fernet_for(secret: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_INFO).derive(secret.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _fernet() -> MultiFernet:
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([_fernet_for(s) for s in secrets])


def encrypt(secret: str) -> str:
    """Return `secret` encrypted under the current SECRET_KEY."""
    return _fernet().encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    """Return the plaintext of `token`; raise CredentialUnreadable if no secret opens it."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise CredentialUnreadable(
            "a stored API key could not be decrypted with this server's secret key; enter the key again"
        ) from None


def rotate() -> int:
    """Re-encrypt every stored credential under the current SECRET_KEY; return how many."""
    from instances.models import Credential

    fernet = _fernet()
    count = 0
    for credential in Credential.objects.all():
        try:
            rotated = fernet.rotate(credential.secret_encrypted.encode()).decode()
        except InvalidToken:
            continue
        Credential.objects.filter(pk=credential.pk).update(secret_encrypted=rotated)
        count += 1
    return count


def _own_credential(instance: Instance) -> Credential | None:
    credential = instance.credential if instance.credential_id else None
    # A credential lent across owners is never used: keys belong to the person who brought them.
    if credential is not None and credential.owner_id != instance.owner_id:
        return None
    return credential


def resolve_api_key(instance: Instance) -> str | None:
    """Return the API key the instance's brain uses, or None when there is none.

    Raises CredentialUnreadable when the instance's stored key cannot be decrypted.
    """
    credential = _own_credential(instance)
    if credential is not None:
        return str(credential.reveal())
    return os.environ.get(ENV_KEY) or None


def resolve_base_url(instance: Instance) -> str:
    """Return the Messages API endpoint the instance talks to."""
    return (instance.base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL).rstrip("/")


def describe_source(instance: Instance) -> str:
    """Return where the instance's key comes from, for pages (never the key itself)."""
    credential = _own_credential(instance)
    if credential is not None:
        return f"credential {credential.label!r} (…{credential.last4})"
    if os.environ.get(ENV_KEY):
        return f"the server's {ENV_KEY}"
    return "none"


def needs_key(instance: Instance) -> bool:
    """Return whether the instance calls Claude: its brain acts with it, or its decider judges with it."""
    return bool(instance.brain == "anthropic" or instance.decider == "llm")


def ensure_usable(instance: Instance) -> None:
    """Refuse, with a ValueError saying how to fix it, an instance that needs a key and has no usable one.

    A no-op for instances that never call Claude, so callers may call it for every run start.
    """
    if not needs_key(instance):
        return
    if instance.credential_id and _own_credential(instance) is None:
        raise ValueError(missing_key_message(instance))
    try:
        key = resolve_api_key(instance)
    except CredentialUnreadable as exc:
        raise ValueError(f"Instance {instance.name!r} cannot use its credential: {exc}.") from None
    if not key:
        raise ValueError(missing_key_message(instance))


def missing_key_message(instance: Instance) -> str:
    """Return what to tell a person whose instance has no key: how to add one."""
    if instance.credential_id and _own_credential(instance) is None:
        return (
            f"Instance {instance.name!r} names a credential that belongs to someone else. "
            "Add your own Anthropic API key under Credentials (console or /admin/) and select it on the instance."
        )
    return (
        f"Instance {instance.name!r} has no Anthropic API key. Add one under Credentials "
        "(console or /admin/ → Credentials → Add), select it on the instance, and start the run again; "
        f"or, for a single-user install, set {ENV_KEY} in the server's environment."
    )


def secrets_for(instance: Instance) -> tuple[str, ...]:
    """Return every secret the instance might carry, for scrubbing text before it leaves."""
    found = []
    try:
        key = resolve_api_key(instance)
    except CredentialUnreadable:
        key = None
    if key:
        found.append(key)
    if env_key := os.environ.get(ENV_KEY):
        found.append(env_key)
    return tuple(dict.fromkeys(found))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Return `text` with every occurrence of each secret replaced by a marker."""
    for secret in secrets:
        if secret and len(secret) >= 4 and secret in text:
            text = text.replace(secret, REDACTED)
    return text
