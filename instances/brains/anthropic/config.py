"""The Claude brain's settings and bounds, read from tether/settings.py on every act."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

CACHE = {"type": "ephemeral"}  # a prompt-cache breakpoint on a block


@dataclass(frozen=True)
class Limits:
    retries: int
    backoff: float
    backoff_max: float
    call_timeout: float
    max_tokens_per_call: int
    poll: float = 0.05


def limits() -> Limits:
    """Return the brain's bounds from settings (read on every act, so tests can override them)."""
    return Limits(
        retries=int(settings.TETHER_ANTHROPIC_RETRIES),
        backoff=float(settings.TETHER_ANTHROPIC_BACKOFF_SECONDS),
        backoff_max=float(settings.TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS),
        call_timeout=float(settings.TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS),
        max_tokens_per_call=int(settings.TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL),
    )


def model_for(instance: Any) -> str:
    return instance.model or str(settings.TETHER_ANTHROPIC_DEFAULT_MODEL)

