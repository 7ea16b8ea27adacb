"""Bring-your-own-key credentials: encryption at rest, resolution per instance.

Touches no network. Keys are stored as Fernet tokens whose key is derived from
`settings.SECRET_KEY` with HKDF-SHA256, so the database alone never reveals a key.
Resolving the key for an instance goes: the instance's own `Credential` (owned by the
instance's owner) → the `ANTHROPIC_API_KEY` environment variable (a single-user
install) → none, in which case `ensure_usable` refuses with a message saying how to
add one. The base URL goes: the instance's `base_url` → `ANTHROPIC_BASE_URL` → Anthropic's.

Rotating the encryption key. Django's own rotation setting is honoured: decryption
tries `SECRET_KEY` and then every key in `SECRET_KEY_FALLBACKS` (set from
`TETHER_SECRET_KEY_FALLBACKS` and `$TETHER_HOME/secret_key.fallbacks`); encryption always uses
`SECRET_KEY`. `python manage.py rotate_keys` drives a rotation end to end (README: "Secrets and
key rotation"); `rotate` re-encrypts every stored key under the current secret.

A stored key that no configured secret can decrypt (the old secret was lost) is reported
by `ensure_usable` as unusable: the user re-enters it.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings
from django.db import connections, transaction

from tether import keys

if TYPE_CHECKING:
    from instances.models import Credential, Instance

DEFAULT_BASE_URL = "https://api.anthropic.com"
ENV_KEY = "ANTHROPIC_API_KEY"
ENV_BASE_URL = "ANTHROPIC_BASE_URL"

_SALT = b"tether.credentials"
_INFO = b"tether credential encryption v1"


class CredentialUnreadable(ValueError):
    """A stored key that none of the configured secrets can decrypt."""


def _fernet_for(secret: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(keys.derive(_SALT, _INFO, secret)))


def _fernet(secret: str | None = None, fallbacks: Sequence[str] | None = None) -> MultiFernet:
    secret = settings.SECRET_KEY if secret is None else secret
    if fallbacks is None:
        fallbacks = settings.SECRET_KEY_FALLBACKS
    return MultiFernet([_fernet_for(s) for s in [secret, *fallbacks]])


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


# Every encrypted column, as (model label, field, whether it holds one secret to redact): the apps that
# store a secret register theirs here (`register_encrypted`), so one rotation re-encrypts them all and
# `tether.redaction` keeps each plain secret out of every text (`stored_rows`, `stored_keys`).
_ENCRYPTED: list[tuple[str, str, bool]] = [
    ("instances.Credential", "secret_encrypted", True),
    ("instances.McpServer", "secrets_encrypted", False),  # a JSON object of values, redacted by its tools
]


def register_encrypted(model: str, field: str, *, redact: bool = True) -> None:
    """Have `rotate` re-encrypt `model`'s `field` (a label like "triggers.Trigger") too, and redaction
    keep its plain value out of texts when `redact`."""
    if not any(known[:2] == (model, field) for known in _ENCRYPTED):
        _ENCRYPTED.append((model, field, redact))


def redacted_columns() -> list[tuple[str, str]]:
    """Return the (model label, field) of every encrypted column holding one secret to redact."""
    return [(model, field) for model, field, redact in _ENCRYPTED if redact]


def rotate(secret: str | None = None, fallbacks: Sequence[str] | None = None) -> int:
    """Re-encrypt every stored secret (credentials, MCP server secrets, trigger secrets…) under `secret`
    (default: SECRET_KEY); return how many.

    A secret is opened with `secret` or any of `fallbacks` (default: SECRET_KEY_FALLBACKS);
    one that none of them opens is left as it is (and stays unusable until re-entered).
    """
    fernet = _fernet(secret, fallbacks)
    count = 0
    for label, field, _ in _ENCRYPTED:
        model = apps.get_model(label)
        for pk, token in model.objects.exclude(**{field: ""}).values_list("pk", field):
            try:
                rotated = fernet.rotate(token.encode()).decode()
            except InvalidToken:
                continue
            model.objects.filter(pk=pk).update(**{field: rotated})
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
    if instance.base_url:
        return None  # the server's key goes only to the endpoint the operator chose, never an instance's own
    return os.environ.get(ENV_KEY) or None


def resolve_base_url(instance: Instance) -> str:
    """Return the Messages API endpoint the instance talks to."""
    return (instance.base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL).rstrip("/")


def describe_source(instance: Instance) -> str:
    """Return where the instance's key comes from, for pages (never the key itself)."""
    credential = _own_credential(instance)
    if credential is not None:
        return f"credential {credential.label!r} (…{credential.last4})"
    if os.environ.get(ENV_KEY) and not instance.base_url:
        return f"the server's {ENV_KEY}"
    return "none"


def needs_key(instance: Instance) -> bool:
    """Return whether the instance calls Claude: its brain acts with it, its decider or its judge judges with it."""
    return bool(instance.brain == "anthropic" or instance.decider == "llm" or getattr(instance, "judge_rubric", ""))


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
    if instance.base_url and os.environ.get(ENV_KEY):
        return (
            f"Instance {instance.name!r} sends its model calls to its own base_url ({instance.base_url}), and the "
            f"server's {ENV_KEY} is only ever sent to the operator's endpoint. Add your own key under Credentials "
            "and select it on the instance, or clear base_url."
        )
    return (
        f"Instance {instance.name!r} has no Anthropic API key. Add one under Credentials "
        "(console or /admin/ → Credentials → Add), select it on the instance, and start the run again; "
        f"or, for a single-user install, set {ENV_KEY} in the server's environment."
    )


def secrets_for(instance: Instance) -> tuple[str, ...]:
    """Return every key the instance might carry, for `tether.redaction` to keep out of texts."""
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



def stored_rows() -> tuple[tuple[str, int, str], ...] | None:
    """Every stored secret to redact, encrypted, as (model label, pk, token), for `tether.redaction`:
    the credentials and what other apps registered (`register_encrypted`: a trigger's secret).
    None when not to be read now.

    Only over a database connection this thread already has open, never opening one (acts give
    theirs back), and in a savepoint inside a transaction, so a failure spoils nothing.
    """
    from instances.models import Credential  # lazy: instances.models imports this module

    connection = connections[Credential.objects.db]
    if connection.connection is None:
        return None

    def stored() -> tuple[tuple[str, int, str], ...]:
        found: list[tuple[str, int, str]] = []
        for label, field in redacted_columns():
            model = apps.get_model(label)
            found += [(label, pk, token) for pk, token in model.objects.order_by("pk").values_list("pk", field)]
        return tuple(found)

    try:
        if connection.in_atomic_block:
            with transaction.atomic(using=connection.alias):
                return stored()
        return stored()
    except Exception:  # noqa: BLE001 - async code, no table yet: keep what is known
        return None


def stored_keys(rows: Sequence[tuple[str, int, str]]) -> list[str]:
    """The keys of `stored_rows()` that decrypt (an unreadable one is skipped)."""
    keys = []
    for _, _, token in rows:
        try:
            keys.append(decrypt(token))
        except CredentialUnreadable:
            continue
    return keys
