"""A request a service will not carry out: the one shape of a refusal, for every app's services.

`loops.services.Refused`, `instances.services.InstanceRefused` and `triggers.services.TriggerRefused`
derive from `Refused`; a surface answers any of them the same way (the API: `{"error": message,
"field": field}` with `status`; a page: the message beside the field).
"""

from __future__ import annotations


class Refused(Exception):
    """`message` says what to do instead, `status` is the HTTP status to answer, `field` the field at fault."""

    def __init__(self, message: str, status: int = 400, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field
