"""The brain registry: an instance's `brain` field names its implementation.

`settings.TETHER_BRAINS` maps brain names to dotted paths of classes taking the
instance; the defaults are `command` and `anthropic`. Extra entries plug in other
brains (the benchmarks register an instant one this way).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from budgets import metering, money
from instances.brains.base import Brain, Usage

if TYPE_CHECKING:
    from instances.models import Instance

DEFAULT_BRAINS = {
    "command": "instances.brains.command.CommandBrain",
    "anthropic": "instances.brains.anthropic.act.AnthropicBrain",
}


@cache
def brain_class(name: str) -> Any:
    paths = {**DEFAULT_BRAINS, **settings.TETHER_BRAINS}
    if name not in paths:
        raise ValueError(f"unknown brain {name!r}; known: {', '.join(sorted(paths))}")
    return import_string(paths[name])


def get_brain(instance: Instance) -> Brain:
    """Return the brain that acts for `instance`."""
    return brain_class(instance.brain)(instance)  # type: ignore[no-any-return]


def iteration_reserve(instance: Instance) -> int:
    """Return the micro-dollars an iteration of `instance` reserves up front: what no meter covers.

    Asked of the brain (`Brain.unmetered_reserve`); a plugged-in brain that does not say is
    treated like `command`: its spend is self-reported (TETHER_COMMAND_ITERATION_RESERVE_USD).
    """
    brain = get_brain(instance)
    if hasattr(brain, "unmetered_reserve"):
        return int(brain.unmetered_reserve())
    from instances.brains.command import reported_spend_allowance  # lazy: cycle via instances.gateway

    return reported_spend_allowance()


def reported_overdraft(instance: Instance, usage: Usage) -> str:
    """Return why an act's self-reported spend (`usage`) ends its run: above what its iteration reserved; or ""."""
    _, reported = metering.split_cost(usage, usage.metered_micros)
    allowance = iteration_reserve(instance)
    if reported <= allowance:
        return ""
    return (
        f"the agent reported spending {money.format_usd(reported)}, more than the {money.format_usd(allowance)} its "
        f"iteration reserved (only metered spend is hard-capped); the overdraft of "
        f"{money.format_usd(reported - allowance)} is recorded and its pools grant nothing more until it is covered"
    )


def _reset(setting: str, **kwargs: Any) -> None:
    if setting == "TETHER_BRAINS":
        brain_class.cache_clear()


setting_changed.connect(_reset)
