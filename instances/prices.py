"""Refuse an instance whose model calls Tether cannot price.

An instance that calls Claude (its brain acts with it, or its `llm` decider judges with it)
needs a row in the price table for the model it really calls (`model_for`: its own, else the
default), or no reservation could bound its spend. Read-only: raises, never writes.
"""

from __future__ import annotations

from typing import Any

from budgets import selectors
from budgets.pricing import UnpricedModel
from instances.brains.anthropic.config import model_for
from instances.models import Instance


def claude_model(instance: Any) -> str | None:
    """Return the model `instance` calls Claude with by its own model setting, or None if it never does.

    Its brain and an `llm` decider call with it, and so does its judge when no `judge_model` names
    another (`ensure_priced` checks that one). A `command` agent whose only Claude call is a judge
    with its own model never calls its `model`.
    """
    judged_with_it = bool(getattr(instance, "judge_rubric", "")) and not getattr(instance, "judge_model", "")
    if not (instance.brain == "anthropic" or instance.decider == "llm" or judged_with_it):
        return None
    return model_for(instance)


def ensure_priced(instance: Any) -> None:
    """Raise `UnpricedModel`, naming the instance, the model and how to add a price, if a model it calls has none.

    Its judge's model too (`judge_model`, whenever it is named): a judge call that cannot be
    priced could not be metered. The exception's `field` names the setting at fault.
    """
    for field, who, name in (
        ("model", "calls Claude with", claude_model(instance)),
        ("judge_model", "has its done judged by", getattr(instance, "judge_model", "")),
    ):
        if not name:
            continue
        try:
            selectors.price_for_model(name)
        except UnpricedModel:
            refused = UnpricedModel(name, who=f"Instance {instance.name!r} {who}")
            refused.field = field
            raise refused from None


def template_usable(template: Any) -> bool:
    """Whether an instance made from `template` as it is would be kept (every model it calls has a price)."""
    try:
        ensure_priced(Instance(name=template.name, **template.instance_defaults()))
    except UnpricedModel:
        return False
    return True
