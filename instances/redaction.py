"""Redaction: the one place that keeps the server's keys out of what leaves it.

`redact(text)` returns `text` with every run of 12 or more consecutive characters of a key
replaced by `[redacted]` — of the key itself, and of its base64 (standard and URL-safe, at each
of the three byte alignments, so a piece of the key inside a longer base64 text is caught too).
Matches are maximal: the whole run is replaced, not just 12 characters of it. A run of 11
characters or fewer is ordinary text and stays. `redact_data(value)` does the same to every
string inside JSON-like data. Tool output, model answers, command and check output, events,
receipts, review diffs and log lines all pass through here before they are shown, stored or sent.

The keys: the server's own (`SECRET_KEY` and `SECRET_KEY_FALLBACKS`, `ANTHROPIC_API_KEY`,
`TETHER_METRICS_TOKEN`, the database and Redis passwords, and every environment variable whose
name ends in `_KEY`, `_TOKEN`, `_SECRET` or `_PASSWORD`), every stored credential (decrypted), and
whatever the caller adds (`extra`: the key a brain is about to use). Keys shorter than 12
characters are too short to tell from ordinary text and are not redacted.

How: for each key set an index maps every 8-character piece of every form of every key to where
it occurs; the text is probed every 5 characters (any 12-character match contains a probed
8-character piece), and each hit is extended both ways to the whole matching run. Cost is one
dictionary look-up per 5 characters of text plus the length of real matches.

Caching, per process: the index of a key set is kept (a few, least recently used first out); the
decrypted stored credentials are reloaded when one is saved or deleted in this process (signals)
and, at most every `TETHER_REDACTION_REFRESH_SECONDS` (5 s), when the stored rows changed (another
process added one) — only over a database connection this thread already has open, never
opening one (acts give theirs back) and never from async code. Keys and their pieces are held in
memory only: never logged, stored or returned.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

REDACTED = "[redacted]"
MIN_RUN = 12  # the shortest run of a key's characters that is redacted
_GRAM = 8  # indexed piece length; probes every MIN_RUN - _GRAM + 1 characters
_STEP = MIN_RUN - _GRAM + 1
_KEY_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
_INDEXES_KEPT = 8


def key_forms(key: str) -> set[str]:
    """Return the texts a key may appear as: itself and its base64 at every byte alignment."""
    forms = {key}
    raw = key.encode()
    for skip in range(3):
        body = raw[skip:]
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            # Its last characters also encode what follows the key; a match just stops earlier there.
            forms.add(encode(body).decode().rstrip("="))
    return {form for form in forms if len(form) >= MIN_RUN}


class Redactor:
    """An index of a fixed set of keys; `redact` and `spans` scan texts against it."""

    def __init__(self, keys: Iterable[str]) -> None:
        forms: set[str] = set()
        for key in keys:
            if key and len(key) >= MIN_RUN:
                forms |= key_forms(key)
        self._forms = sorted(forms)
        self._index: dict[str, list[tuple[int, int]]] = {}
        for number, form in enumerate(self._forms):
            for at in range(len(form) - _GRAM + 1):
                self._index.setdefault(form[at : at + _GRAM], []).append((number, at))

    def __repr__(self) -> str:
        return f"<Redactor of {len(self._forms)} key forms>"

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Return the maximal, merged [start, end) runs of `text` that are 12+ characters of a key."""
        index, forms, size = self._index, self._forms, len(text)
        if not index or size < MIN_RUN:
            return []
        found = []
        for probe in range(0, size - _GRAM + 1, _STEP):
            for number, at in index.get(text[probe : probe + _GRAM], ()):
                form = forms[number]
                start, end, left, right = probe, probe + _GRAM, at, at + _GRAM
                while start > 0 and left > 0 and text[start - 1] == form[left - 1]:
                    start, left = start - 1, left - 1
                while end < size and right < len(form) and text[end] == form[right]:
                    end, right = end + 1, right + 1
                if end - start >= MIN_RUN:
                    found.append((start, end))
        merged: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def redact(self, text: str) -> str:
        spans = self.spans(text)
        if not spans:
            return text
        parts, last = [], 0
        for start, end in spans:
            parts += [text[last:start], REDACTED]
            last = end
        parts.append(text[last:])
        return "".join(parts)


# --- the keys ---------------------------------------------------------------------------------


def server_keys() -> tuple[str, ...]:
    """Return every key the server itself holds (settings and environment)."""
    keys = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    keys.append(os.environ.get("ANTHROPIC_API_KEY", ""))
    keys.append(str(getattr(settings, "TETHER_METRICS_TOKEN", "") or ""))
    for database in settings.DATABASES.values():
        keys.append(str(database.get("PASSWORD") or ""))
    if redis_url := getattr(settings, "REDIS_URL", ""):
        try:
            keys.append(urlsplit(redis_url).password or "")
        except ValueError:
            pass
    keys += [value for name, value in os.environ.items() if name.upper().endswith(_KEY_SUFFIXES)]
    return tuple(sorted({k for k in keys if isinstance(k, str) and len(k) >= MIN_RUN}))


class _Stored:
    """The decrypted stored credentials, cached per process (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.keys: tuple[str, ...] = ()
        self.rows: object = None  # what the keys were decrypted from
        self.checked = float("-inf")

    def invalidate(self) -> None:
        self.checked = float("-inf")

    def get(self) -> tuple[str, ...]:
        refresh = float(getattr(settings, "TETHER_REDACTION_REFRESH_SECONDS", 5))
        if time.monotonic() - self.checked < refresh or getattr(self.local, "busy", False):
            return self.keys
        self.local.busy = True  # the query below may log; its log line must not query again
        try:
            self._reload()
        finally:
            self.local.busy = False
        return self.keys

    def _reload(self) -> None:
        from django.apps import apps
        from django.db import connections, transaction

        if not apps.ready:
            return
        from instances.credentials import CredentialUnreadable, decrypt
        from instances.models import Credential

        connection = connections[Credential.objects.db]
        if connection.connection is None:
            return  # never open a connection for this (an act may have handed its own back)
        try:
            if connection.in_atomic_block:
                with transaction.atomic(using=connection.alias):  # a savepoint: a failure spoils nothing
                    rows = tuple(Credential.objects.order_by("pk").values_list("pk", "secret_encrypted"))
            else:
                rows = tuple(Credential.objects.order_by("pk").values_list("pk", "secret_encrypted"))
        except Exception:  # noqa: BLE001 - async code, no table yet: keep what is known
            return
        with self.lock:
            self.checked = time.monotonic()
            if rows == self.rows:
                return
            keys = []
            for _, token in rows:
                try:
                    keys.append(decrypt(token))
                except CredentialUnreadable:
                    continue
            self.keys, self.rows = tuple(sorted(set(keys))), rows


_stored = _Stored()
_indexes: OrderedDict[frozenset[str], Redactor] = OrderedDict()
_indexes_lock = threading.Lock()


def credentials_changed(**_: Any) -> None:
    """Signal receiver: a credential was saved or deleted; reload the stored keys on next use."""
    _stored.invalidate()


def redactor(extra: Iterable[str] = ()) -> Redactor:
    """Return the (cached) redactor of the server's keys, the stored credentials and `extra`."""
    keys = frozenset(k for k in (*server_keys(), *_stored.get(), *extra) if k and len(k) >= MIN_RUN)
    with _indexes_lock:
        found = _indexes.get(keys)
        if found is not None:
            _indexes.move_to_end(keys)
            return found
    built = Redactor(keys)
    with _indexes_lock:
        _indexes[keys] = built
        while len(_indexes) > _INDEXES_KEPT:
            _indexes.popitem(last=False)
    return built


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """Return `text` with every run of 12+ characters of a key (or its base64) replaced."""
    if not text:
        return text
    return redactor(extra).redact(text)


def redact_data(value: Any, extra: Iterable[str] = ()) -> Any:
    """Return JSON-like `value` with every string in it (keys of dicts too) redacted."""
    return _walk(redactor(extra), value)


def redact_each(values: Iterable[Any]) -> list[Any]:
    """Return `redact_data` of each of `values`, the keys looked up once for all (an iteration's events)."""
    scanner = redactor()
    return [_walk(scanner, value) for value in values]


def _walk(scanner: Redactor, item: Any) -> Any:
    if isinstance(item, str):
        return scanner.redact(item)
    if isinstance(item, dict):
        return {_walk(scanner, k) if isinstance(k, str) else k: _walk(scanner, v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return [_walk(scanner, v) for v in item]
    return item
