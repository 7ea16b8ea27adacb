"""Every bound on what a person or a program may send, stated once.

A leaf module (no imports): the schemas (`loops.schemas`, `instances.schemas`, `tether.schema`),
the console's forms, the services, the MCP tools and the template loader read these names, so a
limit is changed here and nowhere else (tests/security/test_one_limit.py fails on a copy).
Model fields keep their `max_length` literal where a migration states it.
"""

from __future__ import annotations

# --- a run --------------------------------------------------------------------------------------
MAX_ITERATIONS = 10_000  # the most iterations a run (or an instance's, a template's default) may have
MAX_MINUTES = 366 * 24 * 60  # the longest wall-clock limit, in minutes: a year (a longer one is no limit)
OBJECTIVE_MAX_CHARS = 1_000_000  # the highest objective cap an instance may have (its own cap is lower)
MESSAGE_MAX_CHARS = 8_000  # an interjection, an answer, or a continued run's message, in characters
TARGET_MAX_CHARS = 200  # a `delegate` call's `to`: an instance's name or id, a template or a role

# --- a webhook trigger -------------------------------------------------------------------------------
HOOK_BODY_MAX_BYTES = 1_000_000  # a delivery's body (GitHub's issue and pull request payloads are a few KB)
HOOK_RATE = (1, 600)  # runs a trigger may start in a minute, lowest and highest; more are refused (429)
HOOK_RATE_DEFAULT = 30
DELIVERY_ID_MAX_CHARS = 200  # a delivery's id (`X-GitHub-Delivery` is a 36-character GUID)
DELIVERY_EXCERPT_CHARS = 2_000  # how much of a delivery's body is kept to show on the trigger's page
SCHEDULE_INTERVAL_MINUTES = (1, 60 * 24 * 366)  # a schedule's interval, shortest and longest, in minutes
SCHEDULE_CATCH_UP_MINUTES = (0, 60 * 24 * 7)  # how late a missed firing may still run after downtime
SCHEDULE_HORIZON_DAYS = 3653  # a schedule's starts_at / ends_at lie at most this far (~10 years) ahead
SCHEDULE_MISSED_RECORDED = 60  # missed firings recorded one by one after downtime; the rest as one row
FIRINGS_KEPT = 500  # firings kept per schedule, newest first (older ones are deleted)
DELIVERIES_KEPT = 200  # deliveries kept per trigger, newest first (older ones are deleted)

# --- money ----------------------------------------------------------------------------------------
CAP_MIN_USD = "0.01"  # the smallest cost cap, in US dollars (a cap is never $0)
CAP_DIGITS = 6  # a cost cap's whole dollars have at most this many digits: at most $1,000,000
CAP_MAX_USD = 10**CAP_DIGITS  # the largest cost cap, in US dollars

# --- an instance's settings: (lowest, highest) ------------------------------------------------------
NAME_MAX_CHARS = 100  # a name people read (an instance, a key's label, a token, a check, a model)
TEMPLATE_NAME_MAX_CHARS = 50  # a template's name (a slug)
PATH_MAX_CHARS = 500  # a workspace path or a model endpoint's URL
PROMPT_MAX_CHARS = 100_000  # a system prompt; a check's output given to the decider
MAX_TOOL_TURNS = 200  # tool turns in one act
MAX_OUTPUT_TOKENS = 1_000_000  # output tokens in one act
MAX_TOOL_TIMEOUT_SECONDS = 3600  # one shell command or one check: an hour
MAX_ACT_TIMEOUT_SECONDS = 24 * 3600  # one act: a day
KEY_CHARS = (20, 400)  # a stored model key's length, shortest and longest
