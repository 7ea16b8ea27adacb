"""Objective templates: `Triage issue #{issue.number}: {issue.title}` filled from a JSON value.

Pure: no Django, no I/O. A template is text with fields in braces; a field is a dotted path of
dictionary keys and list indexes (`{issue.labels.0.name}`), looked up in plain JSON data (what
`json.loads` returns) and nothing else: no attribute access, no method calls, no format specs
(`{x:>9}`), no conversions (`{x!r}`), no names starting with `__`. `{{` and `}}` are literal braces.
A path the data does not hold is refused, and so is a result longer than the cap it is given
(checked as it is built, so a huge payload never becomes a huge string). A webhook's payload is
the data of a trigger's template; a schedule's is `{date, last_run: {id, outcome}}`.

This is deliberately not `str.format`: `str.format` on untrusted data walks attributes
(`{0.__class__.__init__.__globals__}`) and pads to any width (`{x:>999999999}`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


class TemplateError(ValueError):
    """A template that cannot be used, or data it cannot be filled from; `message` says what to change."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Field:
    """One `{a.b.0}` in a template: its path, as written and as parts."""

    text: str
    parts: tuple[str, ...]


def parse(template: str) -> list[str | Field]:
    """Return the template as literal texts and fields, in order; TemplateError if it is malformed."""
    pieces: list[str | Field] = []
    literal: list[str] = []
    i, n = 0, len(template)
    while i < n:
        char = template[i]
        if char == "{" and template.startswith("{{", i):
            literal.append("{")
            i += 2
        elif char == "}" and template.startswith("}}", i):
            literal.append("}")
            i += 2
        elif char == "}":
            raise TemplateError(f"a lone '}}' at character {i + 1}: write '}}}}' for a literal brace")
        elif char == "{":
            end = template.find("}", i + 1)
            if end < 0:
                raise TemplateError(
                    f"the field opened at character {i + 1} is never closed: write '{{{{' for a literal brace"
                )
            if literal:
                pieces.append("".join(literal))
                literal = []
            pieces.append(_field(template[i + 1 : end], i + 1))
            i = end + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        pieces.append("".join(literal))
    return pieces


def _field(inside: str, at: int) -> Field:
    shown = f"{{{inside}}}" if len(inside) <= 60 else f"{{{inside[:60]}…}}"
    if not inside.strip():
        raise TemplateError(f"an empty field {{}} at character {at}: name a path, like {{issue.title}}")
    if "{" in inside:
        raise TemplateError(f"a field inside a field at character {at}: fields do not nest")
    if "!" in inside:
        raise TemplateError(f"{shown}: conversions like !r or !s are not allowed; name a path only")
    if ":" in inside:
        raise TemplateError(f"{shown}: format specifications (after ':') are not allowed; name a path only")
    parts = tuple(inside.split("."))
    for part in parts:
        if part.startswith("__"):
            raise TemplateError(f"{shown}: names starting with '__' are not looked up")
        if not _SEGMENT.fullmatch(part):
            raise TemplateError(
                f"{shown}: a field is a dotted path of keys and list indexes (letters, digits, '_' and '-', "
                "like {issue.labels.0.name}); no spaces, brackets, calls or other characters"
            )
    return Field(inside, parts)


def fields(template: str) -> list[str]:
    """Return the paths a template names, in order (each once); TemplateError if it is malformed."""
    return list(dict.fromkeys(piece.text for piece in parse(template) if isinstance(piece, Field)))


def lookup(data: Any, field: Field) -> Any:
    """Return the value at `field`'s path in JSON `data`; TemplateError naming the first part that is missing."""
    value = data
    for depth, part in enumerate(field.parts):
        where = ".".join(field.parts[:depth]) or "the payload"
        if isinstance(value, dict):
            if part not in value:
                raise TemplateError(f"{{{field.text}}}: {where} has no key {part!r}")
            value = value[part]
        elif isinstance(value, list):
            if not part.isdigit() or int(part) >= len(value):
                raise TemplateError(
                    f"{{{field.text}}}: {where} is a list of {len(value)}; {part!r} is not an index in it"
                )
            value = value[int(part)]
        else:
            raise TemplateError(f"{{{field.text}}}: {where} is {_kind(value)}, not an object or a list")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    return "text" if isinstance(value, str) else type(value).__name__


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    raise TemplateError(f"a value of type {type(value).__name__} is not JSON")  # only JSON data is filled in


def render(template: str, data: Any, *, max_chars: int) -> str:
    """Return `template` filled from JSON `data`, at most `max_chars` characters (a CRLF counts as one).

    Null fills in as nothing; numbers and true/false as JSON writes them; an object or a list as
    its JSON text. TemplateError if a path is missing or the result would be longer than `max_chars`.
    """
    out: list[str] = []
    length = 0
    for piece in parse(template):
        text = piece if isinstance(piece, str) else _as_text(lookup(data, piece))
        text = text.replace("\r\n", "\n")
        length += len(text)
        if length > max_chars:
            raise TemplateError(
                f"the objective would be longer than {max_chars:,} characters (the instance's objective cap)"
                + ("" if isinstance(piece, str) else f" once {{{piece.text}}} is filled in")
                + "; shorten the template or pick smaller fields"
            )
        out.append(text)
    return "".join(out)
