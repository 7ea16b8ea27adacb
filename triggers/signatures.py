"""Webhook signatures: HMAC-SHA256 of the raw body, as GitHub sends it (`sha256=<hex>`).

Pure: no Django. GitHub signs in `X-Hub-Signature-256`; any other sender may use
`X-Tether-Signature-256` with the same format. The digest is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

HEADERS = ("X-Hub-Signature-256", "X-Tether-Signature-256")
_FORMAT = re.compile(r"sha256=([0-9a-fA-F]{64})")


def sign(secret: str, body: bytes) -> str:
    """Return the header value a sender puts on `body`: `sha256=<hex>`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def problem(secret: str, body: bytes, headers: Mapping[str, str]) -> str:
    """Return "" when `headers` carry a valid signature of `body`, else what is wrong (for a 401)."""
    given = next((headers[name] for name in HEADERS if headers.get(name)), None)
    if given is None:
        return f"the delivery is not signed: send {HEADERS[0]} (or {HEADERS[1]}): sha256=<HMAC-SHA256 of the body>"
    found = _FORMAT.fullmatch(given.strip())
    if found is None:
        return "the signature must read sha256=<64 hexadecimal digits>"
    if not hmac.compare_digest(sign(secret, body)[len("sha256=") :], found.group(1).lower()):
        return "the signature does not match the body: check the trigger's secret (it may have been rotated)"
    return ""
