"""Field types for the API's schemas: each type both checks a value and documents itself.

Pure (pydantic only, no Django). A request body is a `Body` (unknown fields refused); its
fields use these types, so the rule that refuses a value and the JSON Schema that the OpenAPI
document shows are written once, here. A refusal is a pydantic error whose message reads
after the field's name ("must be a whole number from 1 to 10000; got 0"); `describe` turns
the first error into one sentence and the field at fault.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from tether import limits

# JSON Schema patterns (ECMA-262): no NUL anywhere; and at least one character that is not space.
# "Space" is what Python's str.strip() removes, spelled out: ECMA's \s differs (it counts
# U+FEFF, and not U+001C..U+001F or U+0085), and the pattern must refuse exactly what the
# validator refuses.
SPACE = "\\t\\n\\u000b\\f\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
NO_NUL = "^[^\\u0000]*$"
NONBLANK = f"^[^\\u0000]*[^{SPACE}\\u0000][^\\u0000]*$"
SOMETHING = f"[^{SPACE}]"
# Unicode categories a name may not hold: controls, format characters (bidirectional overrides,
# zero-width spaces and joiners), surrogates, line and paragraph separators. (Private-use and
# unassigned characters show as a box: visible, so allowed, and the schema's pattern stays small.)
INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _invisible_class() -> str:
    """The body of a regex character class holding every character `invisible` refuses (but surrogates,
    which no JSON text decodes to on their own), for the API schema's patterns."""
    ranges: list[list[int]] = []
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF or unicodedata.category(chr(code)) not in INVISIBLE:
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])

    def one(code: int) -> str:
        return f"\\u{code:04x}" if code < 0x10000 else chr(code)

    return "".join(one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in ranges)


# `_invisible_class()` walks every code point (a second of CPU in each process that imports this);
# for the Unicode version it was computed with, its answer is kept here.
_KNOWN_CLASS = (
    "15.1.0",
    "\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u0600-\\u0605\\u061c\\u06dd\\u070f\\u0890-\\u0891\\u08e2\\u180e"
    "\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f",
)
INVISIBLE_CLASS = _KNOWN_CLASS[1] if unicodedata.unidata_version == _KNOWN_CLASS[0] else _invisible_class()

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # what no database column stores: NUL, lone surrogates
MAX_ID = 10**18 - 1  # ids are 1 to 18 digits: they fit a signed 64-bit column


class Body(BaseModel):
    """A request body: a JSON object whose fields are all declared; null means "the default"."""

    model_config = ConfigDict(extra="forbid")


def refuse(why: str, kind: str = "tether", **context: Any) -> PydanticCustomError:
    """Return the error a validator raises; `why` reads after the field's name.

    `context` (e.g. a number's `low`, `high` and what it `got`) lets a form word the refusal its own way.
    """
    return PydanticCustomError(kind, "{why}", {"why": why, **context})


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    return {str: "str", int: "int", float: "float", list: "list", dict: "dict"}.get(
        type(value), type(value).__name__
    )


def clean_text(value: Any, *, max_length: int | None = None, nonblank: bool = False) -> str:
    """Return `value` if it is storable text within bounds; a CRLF counts as one character."""
    if not isinstance(value, str):
        raise refuse(f"must be a string, not {kind_of(value)}")
    found = UNSTORABLE.search(value)
    if found:
        what = (
            "a NUL character"
            if found.group() == "\x00"
            else "a lone surrogate (text that is not valid Unicode)"
        )
        raise refuse(f"holds {what}")
    if nonblank and not value.strip():
        raise refuse("is empty", "blank")
    if max_length is not None:
        length = len(value.replace("\r\n", "\n"))
        if length > max_length:
            raise refuse(f"is {length:,} characters; at most {max_length:,} are accepted")
    return value


def text(*, max_length: int | None = None, nonblank: bool = False, min_length: int = 0, **doc: Any) -> Any:
    """A string without NUL or lone surrogates; `nonblank`: not only white space."""

    def check(value: Any) -> str:
        value = clean_text(value, max_length=max_length, nonblank=nonblank)
        if len(value) < min_length:
            raise refuse("is empty", "blank")
        return value

    schema: dict[str, Any] = {"pattern": NONBLANK if nonblank else NO_NUL}
    if nonblank or min_length:
        schema["minLength"] = max(1, min_length)
    if max_length is not None:
        schema["maxLength"] = max_length
    return Annotated[str, BeforeValidator(check), Field(json_schema_extra=schema, **doc)]


def whole(
    low: int, high: int, *, unit: str = "", between: bool = False, from_text: bool = False, **doc: Any
) -> Any:
    """A whole number from `low` to `high` (3.0 is 3; true/false is not a number).

    `from_text`: a query parameter, given as digits. `between` words the bound as "between L and H".
    """

    def check(value: Any) -> int:
        if from_text and isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,25}", value.strip()):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON has one number type: 3.0 is the whole number 3
        if isinstance(value, bool) or not isinstance(value, int):
            shown = f"{value!r}" if from_text else kind_of(value)
            raise refuse(
                f"must be a whole number{unit}, not {shown}"
                if not from_text
                else f"must be a whole number{unit} from {low} to {high}; got {shown}"
            )
        if not low <= value <= high:
            bound = f"between {low} and {high}" if between else f"a whole number{unit} from {low} to {high}"
            raise refuse(f"must be {bound}; got {value}", low=low, high=high, got=value)
        return value

    return Annotated[
        int, BeforeValidator(check), Field(json_schema_extra={"minimum": low, "maximum": high}, **doc)
    ]


def flag(**doc: Any) -> Any:
    """true or false, nothing else."""

    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise refuse(f"must be true or false, not {kind_of(value)}")
        return value

    return Annotated[bool, BeforeValidator(check), Field(**doc)]


def listed(
    item_check: Callable[[Any], Any], *, min_items: int = 0, words: str = "a list"
) -> Callable[[Any], list]:
    """Return a validator for a list whose items `item_check` cleans (an item refusal names its index)."""

    def check(value: Any) -> list:
        if not isinstance(value, list):
            raise refuse(f"must be {words}, not {kind_of(value)}")
        if len(value) < min_items:
            raise refuse(f"must be {words}")
        cleaned = []
        for i, item in enumerate(value):
            try:
                cleaned.append(item_check(item))
            except PydanticCustomError as exc:
                raise refuse(f"[{i}] {exc.message()}") from None
        return cleaned

    return check


# --- dollars --------------------------------------------------------------------------------------


def _usd_text(high_digits: int) -> str:
    """Text dollars: at most six decimal places, at least 0.01, at most 10**high_digits."""
    whole = f"0{{0,10}}[1-9][0-9]{{0,{high_digits - 1}}}(\\.[0-9]{{1,6}})?|0{{0,10}}1{'0' * high_digits}(\\.0{{1,6}})?"
    cents = "0{0,10}\\.(0[1-9][0-9]{0,4}|[1-9][0-9]{0,5})"
    return f"\\$?({whole}|{cents})"


def usd(high_digits: int, *, required: bool = False, **doc: Any) -> Any:
    """Dollars, as a number or text like "2.50", from 0.01 to 10**`high_digits`, to the micro-dollar.

    An empty text or null is None (no cap), or refused when `required`. Text with more than six
    decimal places is refused; a number is kept to the nearest micro-dollar (never below the
    0.01 floor, so never a $0 cap). A Decimal (what this type gave before) is taken as its text.
    """
    low, high = Decimal(limits.CAP_MIN_USD), Decimal(10) ** high_digits
    pattern = _usd_text(high_digits)
    words = f"a number of US dollars, like 2.50, from {low} to {high:,}"

    def check(value: Any) -> Decimal | None:
        if value is None or value == "":
            if required:
                raise refuse(f"must be {words}; got {'null' if value is None else 'empty text'}")
            return None
        if isinstance(value, Decimal):
            value = str(value)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise refuse(f"must be {words}; got {kind_of(value)}")
        if isinstance(value, str):
            clean_text(value)
            if not re.fullmatch(pattern, value):
                try:
                    big = Decimal(value.strip().removeprefix("$")) > high
                except ArithmeticError:
                    big = False
                more = "; that is more than Tether counts as one cap" if big else ""
                raise refuse(f"must be {words}; got {value!r}{more}")
            dollars = Decimal(value.removeprefix("$"))
        else:
            dollars = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        if not dollars.is_finite():
            raise refuse(f"must be {words}; got {value!r}")
        if dollars < low:
            raise refuse(f"must be {words} (more than 0 dollars, at least {low}); got {value}")
        if dollars > high:
            raise refuse(f"must be {words}; {value} is more than Tether counts as one cap")
        # A JSON number is a binary float (0.07 arrives as 0.07000000000000001 from some clients):
        # kept to the nearest micro-dollar. Text is exact, so its pattern allows six places at most.
        return dollars.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)

    schema = {
        "anyOf": [
            {"type": "number", "minimum": float(low), "maximum": float(high)},
            {"type": "string", "pattern": f"^{pattern}$" if required else f"^$|^{pattern}$"},
            *([] if required else [{"type": "null"}]),
        ],
        "description": f"US dollars from {low} to {high:,}, at most six decimal places "
        '(a number, kept to the micro-dollar, or text like "2.50")' + ("" if required else "; empty or null: none"),
    }
    return Annotated[Decimal | None, BeforeValidator(check), Field(json_schema_extra=schema, **doc)]


# --- errors ---------------------------------------------------------------------------------------


def _where(loc: Iterable[Any]) -> str:
    where = ""
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where


def describe(errors: Sequence[Mapping[str, Any]], allowed: Iterable[str] = ()) -> tuple[str, str | None]:
    """Return (one sentence for a person, the top-level field at fault) for pydantic's `errors`.

    Each error's `loc` is relative to the body (or the query). Missing and unknown fields are
    named together; otherwise the first error is said.
    """
    missing = [_where(e["loc"]) for e in errors if e["type"] == "missing"]
    if missing:
        return f"missing required field(s): {', '.join(missing)}", missing[0].split(".")[0].split("[")[0]
    unknown = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        names = ", ".join(str(loc[-1]) for loc in unknown)
        inside = _where(unknown[0][:-1])
        allowed = sorted(allowed)
        return (
            f"unknown field(s): {names}"
            + (f" (in {inside})" if inside else "")
            + (f"; allowed: {', '.join(allowed)}" if allowed and not inside else ""),
            None,
        )
    first = errors[0]
    loc = list(first["loc"])
    where = _where(loc)
    field = str(loc[0]) if loc and not isinstance(loc[0], int) else None
    kind, message = first["type"], first["msg"]
    if not loc and kind in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object", None
    if kind == "blank":
        return f"missing required field(s): {where}", field
    if kind in ("tether", "value_error", "assertion_error"):
        if kind != "tether":
            message = str(first.get("ctx", {}).get("error", message))
        sep = "" if message[:1] in (":", "[", ".") else " "
        return (f"{where}{sep}{message}" if where else message.lstrip(": ")), field
    if kind in ("list_type",):
        return f"{where} must be a list", field
    if kind in ("dict_type", "model_attributes_type", "model_type"):
        return f"{where} must be an object", field
    if kind in ("string_type",):
        return f"{where} must be a string", field
    if kind in ("bool_type", "bool_parsing"):
        return f"{where} must be true or false", field
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        ctx = first.get("ctx", {})
        low, high = ctx.get("ge", ctx.get("gt")), ctx.get("le", ctx.get("lt"))
        bound = f"at least {low}" if low is not None else f"at most {high}"
        return f"{where} must be a whole number {bound}", field
    if kind.startswith("int_"):
        return f"{where} must be a whole number", field
    if kind == "literal_error" or kind == "enum":
        expected = first.get("ctx", {}).get("expected", "")
        return f"{where} must be one of {expected}", field
    return f"{where}: {message}" if where else message, field
