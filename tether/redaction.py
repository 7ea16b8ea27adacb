"""Redaction: the one place that keeps the server's keys out of what leaves it.

`redact(text)` returns `text` with every run of 12 or more consecutive characters of a key, in
any of the forms below, replaced by `[redacted]`. Matches are maximal: the whole run is replaced,
not just 12 characters of it. A run of 11 characters or fewer is ordinary text and stays.
`redact_data(value)` does the same to every string inside JSON-like data. Tool output, model
answers, command and check output, events, receipts, review diffs, the tool journal and log lines
all pass through here before they are shown, stored or sent.

The forms of a key (`key_forms`): the key itself, reversed, and rot13; its bytes in hex and
%-escaped (`%73%6b…`); its base32 (at each of the five byte alignments); its base64, standard
and URL-safe (at each of the three byte alignments, so a piece of the key inside a longer base64
text is caught too). All but base64 are matched in any case (upper, lower, swapped, mixed); a
case change of base64 is other data, so base64 is matched exactly. The text is also read
- without its whitespace and zero-width characters (U+200B, U+200C, U+200D, U+2060, U+FEFF), so
  a form split by spaces or line breaks, or joined by invisible characters, is one run again;
  a split run counts its pieces that stand apart, not a piece glued to the end of a word (so a
  key's 11 characters between two words are not joined to a letter of either);
- with its %XX escapes decoded (only when it has one), so a key some of whose characters are
  URL-escaped is caught; a run of 12 characters of the fully escaped form is caught as it is.
A 12-character run of a form is 12 characters of that form: of hex, 6 of the key's characters; of
the fully %-escaped form, 4.

The keys: the server's own (`SECRET_KEY` and `SECRET_KEY_FALLBACKS`, `ANTHROPIC_API_KEY`,
`TETHER_METRICS_TOKEN`, the database and Redis passwords, and every environment variable whose
name ends in `_KEY`, `_TOKEN`, `_SECRET` or `_PASSWORD`), every stored secret (decrypted: the credentials, a trigger's secret…; the app
that stores them names where they come from with `stored_keys_from`, so this module imports no app), and
whatever the caller adds (`extra`: the key a brain is about to use). Keys shorter than 12
characters are too short to tell from ordinary text and are not redacted.

How: for each key set an index maps every 8-character piece of every form of every key (folded
to lower case) to where it occurs. A text is read in one or two views (without gaps; decoded and
without gaps), each with a map back to the text's own positions, worked out only when something
is found. Each view is probed every 5 characters (any 12-character match contains a probed
8-character piece), and each hit is extended both ways to the whole matching run, compared in
lower case or exactly as its form says; a run already found is not extended again. Cost: building
the views and one dictionary look-up per 5 characters of each (in C: a regular expression takes
the pieces, `compress` keeps those in the index), plus the length of real matches.

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
import re
import string
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, compress
from typing import Any
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings

REDACTED = "[redacted]"
MIN_RUN = 12  # the shortest run of a key's characters that is redacted
_GRAM = 8  # indexed piece length; probes every MIN_RUN - _GRAM + 1 characters
_STEP = MIN_RUN - _GRAM + 1
_KEY_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
_INDEXES_KEPT = 8

_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"  # zero-width space, non-joiner, joiner; word joiner; BOM
_GAPS = re.compile(f"([\\s{_INVISIBLE}]+)")
_ESCAPES = re.compile("(%[0-9A-Fa-f]{2})")
_PROBES = re.compile(f"(?=(.{{{_GRAM}}})).{{{_STEP}}}", re.S)  # the 8 characters at every 5th position
_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ROT13 = str.maketrans(
    string.ascii_lowercase + string.ascii_uppercase,
    string.ascii_lowercase[13:] + string.ascii_lowercase[:13] + string.ascii_uppercase[13:] + string.ascii_uppercase[:13],
)


def _fold(text: str) -> str:
    """Return `text` in lower case, one character for one (so positions still match)."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_LOWER)


def key_forms(key: str) -> dict[str, bool]:
    """Return the texts a key may appear as (without gaps), each with whether it is matched in any case."""
    raw = key.encode()
    caseless = {key, key[::-1], key.translate(_ROT13), raw.hex(), "".join(f"%{byte:02x}" for byte in raw)}
    exact = set()
    # The last characters of an encoding at an alignment also encode what follows the key; a match
    # just stops earlier there.
    for skip in range(5):
        caseless.add(base64.b32encode(raw[skip:]).decode().rstrip("="))
    for skip in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            exact.add(encode(raw[skip:]).decode().rstrip("="))
    forms = {_GAPS.sub("", form): False for form in exact}
    forms.update({_fold(_GAPS.sub("", form)): True for form in caseless})
    return {form: anycase for form, anycase in forms.items() if len(form) >= MIN_RUN}


class _View:
    """A text with every match of `pattern` replaced by `size` characters, and where each came from.

    The map back (`origin`) is worked out only when a run is found: most texts have none.
    """

    def __init__(
        self, source: str, text: str, pattern: re.Pattern[str], size: int, parent: _View | None = None
    ) -> None:
        self.source, self.text, self.pattern, self.size, self.parent = source, text, pattern, size, parent
        self._map: tuple[list[int], list[int], list[int]] | None = None

    def _replaced(self) -> tuple[list[int], list[int], list[int]]:
        """Return where each replacement starts in this text, and starts and ends in the source."""
        if self._map is None:
            parts = self.pattern.split(self.source)  # kept, found, kept, …, kept
            ends = list(accumulate(map(len, parts)))
            kept = accumulate(map(len, parts[0::2]))
            starts = [end + number * self.size for number, end in enumerate(kept)][:-1]
            self._map = starts, ends[0:-1:2], ends[1::2]
        return self._map

    def origin(self, start: int, end: int) -> tuple[int, int]:
        """Return the positions in the original text of this view's [start, end)."""
        start, end = self._old(start)[0], self._old(end - 1)[1]
        return self.parent.origin(start, end) if self.parent is not None else (start, end)

    def _old(self, at: int) -> tuple[int, int]:
        starts, old_starts, old_ends = self._replaced()
        number = bisect_right(starts, at) - 1
        if number < 0:
            return at, at + 1
        if at < starts[number] + self.size:
            return old_starts[number], old_ends[number]
        old = old_ends[number] + at - starts[number] - self.size
        return old, old + 1

    def trim(self, start: int, end: int) -> tuple[int, int]:
        """Return a run spanning a gap without its end pieces that are short and glued to a word.

        The 11 characters of a key between two words are then not made 12 by a letter of either.
        """
        if self.size:
            return start, end
        gaps, text = self._replaced()[0], self.text
        first, last = bisect_right(gaps, start), bisect_left(gaps, end) - 1
        if first > last:
            return start, end  # no gap inside: an ordinary run
        if start > (gaps[first - 1] if first else 0) and text[start - 1].isalnum() and gaps[first] - start < MIN_RUN:
            start = gaps[first]
        piece_end = gaps[last + 1] if last + 1 < len(gaps) else len(text)
        if end < piece_end and text[end].isalnum() and end - gaps[last] < MIN_RUN:
            end = gaps[last]
        return start, end


def _without_gaps(source: str, parent: _View | None = None) -> _View:
    """Return the view of `source` without its whitespace and zero-width characters."""
    text = "".join(source.split())  # str.split's whitespace is exactly the pattern's \s
    for char in _INVISIBLE:
        text = text.replace(char, "")
    return _View(source, text, _GAPS, 0, parent)


def _views(text: str) -> Iterator[_View]:
    """Yield the views a text is read in: without gaps; if it has %XX escapes, decoded and without gaps."""
    yield _without_gaps(text)
    if "%" in text and _ESCAPES.search(text):
        decoded = _View(text, _ESCAPES.sub(lambda escape: chr(int(escape[1][1:], 16)), text), _ESCAPES, 1)
        yield _without_gaps(decoded.text, decoded)


class Redactor:
    """An index of a fixed set of keys; `redact` and `spans` scan texts against it."""

    def __init__(self, keys: Iterable[str]) -> None:
        forms: dict[str, bool] = {}
        for key in keys:
            if key and len(key) >= MIN_RUN:
                for form, anycase in key_forms(key).items():
                    forms[form] = forms.get(form, False) or anycase
        self._forms = sorted(forms.items())
        self._index: dict[str, list[tuple[int, int]]] = {}
        for number, (form, _) in enumerate(self._forms):
            folded = _fold(form)
            for at in range(len(form) - _GRAM + 1):
                self._index.setdefault(folded[at : at + _GRAM], []).append((number, at))

    def __repr__(self) -> str:
        return f"<Redactor of {len(self._forms)} key forms>"

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Return the maximal, merged [start, end) runs of `text` that are 12+ characters of a key."""
        if not self._index or len(text) < MIN_RUN:
            return []
        found = []
        for view in _views(text):
            for start, end in self._runs(view.text):
                start, end = view.trim(start, end)
                if end - start >= MIN_RUN:
                    found.append(view.origin(start, end))
        merged: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def _runs(self, text: str) -> Iterator[tuple[int, int]]:
        """Yield the maximal runs of `text` that are 12+ characters of one form (some more than once)."""
        index, forms, size = self._index, self._forms, len(text)
        folded = _fold(text)
        pieces = _PROBES.findall(folded)
        probes = compress(range(0, len(pieces) * _STEP, _STEP), map(index.__contains__, pieces))
        reached: dict[tuple[int, int], int] = {}  # (form, offset) -> end of the run found there
        for probe in probes:
            for number, at in index[folded[probe : probe + _GRAM]]:
                if reached.get((number, probe - at), -1) > probe:
                    continue  # inside a run found already
                form, anycase = forms[number]
                seen = folded if anycase else text
                start, end, left, right = probe, probe, at, at
                while end < size and right < len(form) and seen[end] == form[right]:
                    end, right = end + 1, right + 1
                while start > 0 and left > 0 and seen[start - 1] == form[left - 1]:
                    start, left = start - 1, left - 1
                reached[(number, probe - at)] = end
                if end - start >= MIN_RUN:
                    yield start, end

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
    keys.append(str(settings.TETHER_METRICS_TOKEN or ""))
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
        # Where the stored keys come from (`stored_keys_from`): read a snapshot, decrypt it.
        self.source: tuple[Callable[[], object | None], Callable[[Any], Iterable[str]]] | None = None

    def invalidate(self) -> None:
        self.checked = float("-inf")

    def get(self) -> tuple[str, ...]:
        refresh = float(settings.TETHER_REDACTION_REFRESH_SECONDS)
        if time.monotonic() - self.checked < refresh or getattr(self.local, "busy", False):
            return self.keys
        self.local.busy = True  # the query below may log; its log line must not query again
        try:
            self._reload()
        finally:
            self.local.busy = False
        return self.keys

    def _reload(self) -> None:
        if not apps.ready or self.source is None:
            return
        read, decrypt = self.source
        rows = read()
        if rows is None:
            return  # no connection of this thread's, async code, no table yet: keep what is known
        with self.lock:
            self.checked = time.monotonic()
            if rows == self.rows:
                return
            self.keys, self.rows = tuple(sorted(set(decrypt(rows)))), rows


_stored = _Stored()
_indexes: OrderedDict[frozenset[str], Redactor] = OrderedDict()
_indexes_lock = threading.Lock()


def stored_keys_from(read: Callable[[], object | None], decrypt: Callable[[Any], Iterable[str]]) -> None:
    """Name where the stored keys come from (the app that stores credentials calls this as it starts).

    `read()` returns a snapshot of the stored rows, comparable with `==`, or None to keep what is
    known; it must never open a database connection. `decrypt(rows)` returns the keys in them.
    """
    _stored.source = (read, decrypt)
    _stored.invalidate()


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
    """Return `text` with every run of 12+ characters of a key, in any of its forms, replaced."""
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
