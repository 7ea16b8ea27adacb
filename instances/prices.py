"""Refuse an instance whose model calls Tether cannot price.

An instance that calls Claude (its brain acts with it, or its `llm` decider judges with it)
needs a row in the price table for the model it really calls (`model_for`: its own, else the
default), or no reservation could bound its spend. Read-only: raises, never writes.
"""

from __future__ import annotations

from typing import Any

from budgets import selectors
from budgets.pricing import UnpricedModel
from instances import credentials


def claude_model(instance: Any) -> str | None:
    """Return the model `instance` calls Claude with, or None if it never calls Claude."""
    if not credentials.needs_key(instance):
        return None
    from instances.brains.anthropic import model_for

    return model_for(instance)


def ensure_priced(instance: Any) -> None:
    """Raise `UnpricedModel`, naming the instance, the model and how to add a price, if its model has none."""
    model = claude_model(instance)
    if model is None:
        return
    try:
        selectors.price_for_model(model)
    except UnpricedModel:
        raise UnpricedModel(model, who=f"Instance {instance.name!r} calls Claude with") from None
