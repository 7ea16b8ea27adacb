"""Tether's settings plus the brains the harnesses register (TETHER_BRAINS is not an env knob)."""

from tether.settings import *  # noqa: F403

TETHER_BRAINS = {"sleep": "bench.load.SleepBrain"}
