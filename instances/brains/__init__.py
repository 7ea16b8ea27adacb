"""The brain registry: an instance's `brain` field names its implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from instances.brains.base import Brain

if TYPE_CHECKING:
    from instances.models import Instance


def get_brain(instance: Instance) -> Brain:
    """Return the brain that acts for `instance`."""
    if instance.brain == "command":
        from instances.brains.command import CommandBrain

        return CommandBrain(instance)
    if instance.brain == "anthropic":
        from instances.brains.anthropic import AnthropicBrain  # type: ignore[import-not-found]

        return AnthropicBrain(instance)  # type: ignore[no-any-return]
    raise ValueError(f"unknown brain {instance.brain!r}")
