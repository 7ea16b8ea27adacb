"""Check an instance's fields against their one schema, for every surface that writes one (API, console).

The fields, their types and bounds are `instances.schemas.InstanceIn` (the same schema the
API parses and documents); this module applies it to values a form or a service holds and
raises `InvalidInstance` naming the field. Touches no database. What a user may set at all
is `instances.capabilities`; whether its model has a price is `instances.prices`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from instances.schemas import BOUNDS, InstanceIn
from tether.schema import describe

__all__ = ["BOUNDS", "InvalidInstance", "validate"]


class InvalidInstance(ValueError):
    """A field value that does not make a valid agent; `field` names it (None: the whole)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def validate(data: dict[str, Any], *, from_template: bool = False) -> dict[str, Any]:
    """Check an instance's fields; return the cleaned values (None values dropped).

    `from_template`: `data` holds overrides of a template, so nothing is required but a name;
    otherwise `data` defines the whole agent (a command brain needs its command). Keys the
    schema does not know (a form's `credential` object, `mcp_servers`) pass through unchanged.
    """
    from instances.models import Instance

    clean = {k: v for k, v in data.items() if v is not None}
    known = {k: v for k, v in clean.items() if k in InstanceInFields}
    known.setdefault("name", "")
    try:
        parsed = InstanceIn.model_validate(known, context={"from_template": from_template})
    except ValidationError as exc:
        message, field = describe(exc.errors(include_url=False))
        if message.startswith("missing required field(s): name"):
            message = "name must be 1 to 100 characters"
        raise InvalidInstance(message, field) from None
    clean.update(parsed.model_dump(exclude_unset=True, exclude_none=True))
    if not from_template:
        clean.setdefault("brain", Instance.Brain.COMMAND)
        clean.setdefault("decider", Instance.Decider.CHECKS)
    return clean


InstanceInFields = frozenset(InstanceIn.model_fields)
