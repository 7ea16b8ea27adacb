"""Tether's one settings file, driven by the environment.

Embedded default: SQLite under TETHER_HOME and the django-q2 ORM broker.
Scale-out: DATABASE_URL (PostgreSQL) and REDIS_URL (the channels_redis layer).

Every `TETHER_*` setting is declared here, once, with its default and what it means; the apps read
`settings.TETHER_X` and never give a default of their own (tests/ops/test_one_owner.py). A bad
value stops Tether at start naming it.
"""

import json
import os
import secrets
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from tether.filemodes import private_database, private_directory

BASE_DIR = Path(__file__).resolve().parent.parent
TETHER_HOME = Path(os.environ.get("TETHER_HOME", BASE_DIR / "var")).resolve()
# Only the OS user Tether runs as may enter its home (secret key, database, workspaces): 0700.
private_directory(TETHER_HOME)


def _env[T](name: str, default: T, parse: Callable[[str], T], must_be: str) -> T:
    """Return the environment's `name` read by `parse`, or `default` when it is unset or empty.

    What `parse` refuses (a ValueError) stops Tether at start, naming the setting and what it must be.
    """
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be {must_be}, got {raw!r}") from None


def _env_int(name: str, default: int) -> int:
    return _env(name, default, int, "a whole number")


def _env_float(name: str, default: float) -> float:
    return _env(name, default, float, "a number")


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _env_json(name: str, default: Any) -> Any:
    """A value given as JSON (a number, true/false, a list, an object); text that is no JSON is kept as text."""
    return _env(name, default, _json_or_text, "JSON or text")  # never refused: text is kept


def _secret_key() -> str:
    if key := os.environ.get("TETHER_SECRET_KEY"):
        return key
    path = TETHER_HOME / "secret_key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


def _secret_key_fallbacks() -> list[str]:
    # Earlier secret keys, still accepted (credentials, receipts, sessions) while a rotation settles:
    # TETHER_SECRET_KEY_FALLBACKS (comma-separated) and $TETHER_HOME/secret_key.fallbacks (one a line,
    # written by `manage.py rotate_keys`). README: "Secrets and key rotation".
    listed = os.environ.get("TETHER_SECRET_KEY_FALLBACKS", "").split(",")
    path = TETHER_HOME / "secret_key.fallbacks"
    if path.exists():
        listed += path.read_text().splitlines()
    return list(dict.fromkeys(k.strip() for k in listed if k.strip()))


SECRET_KEY = _secret_key()
SECRET_KEY_FALLBACKS = _secret_key_fallbacks()
DEBUG = os.environ.get("TETHER_DEBUG", "") == "1"
ALLOWED_HOSTS = [h for h in os.environ.get("TETHER_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("TETHER_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "axes",
    "django_htmx",
    "instances",
    "budgets",
    "audit",
    "loops",
    "reviews",
    "triggers",
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Outside everything that writes a body (so it compresses the final one), HTML and JSON only,
    # never a `no-store` response (a secret shown once): BREACH, see tether/compression.py.
    "tether.compression.ConsoleGZipMiddleware",
    "tether.middleware.DatabaseUnavailableMiddleware",  # a database outage is a 503, never a 500
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",  # request.htmx: did htmx send this request?
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "tether.urls"
ASGI_APPLICATION = "tether.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "instances.sandbox.context_processor",
                "web.console.views.console_settings",
            ],
        },
    },
]

# --- database -------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
# Behind PgBouncer in transaction pooling mode (docs/operations.md: Connection budget).
TETHER_DB_PGBOUNCER = os.environ.get("TETHER_DB_PGBOUNCER", "") == "1"
if DATABASE_URL:
    import dj_database_url

    # A web or worker process takes its connections from a bounded pool (tether/dbpool.py, turned on
    # as it starts). Other processes (the cluster's own, `manage.py` commands) keep a connection per
    # thread (and ping it before reuse) rather than opening one for every query.
    _db = dj_database_url.parse(
        DATABASE_URL, conn_max_age=_env_int("TETHER_DB_CONN_MAX_AGE", 60), conn_health_checks=True
    )
    if _db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(f"DATABASE_URL must point at PostgreSQL (postgres://...), got {_db['ENGINE']}")
    # Behind PgBouncer (transaction pooling) neither a cursor nor a prepared statement outlives its
    # transaction: `.iterator()` reads in chunks instead, and psycopg prepares nothing.
    if TETHER_DB_PGBOUNCER:
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
        _db.setdefault("OPTIONS", {})["prepare_threshold"] = None
    _db.setdefault("TEST", {})
    if name := os.environ.get("TETHER_TEST_DB_NAME"):
        _db["TEST"]["NAME"] = name
    DATABASES = {"default": _db}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            # Created 0600 before SQLite opens it (its -wal and -shm files take its mode).
            "NAME": private_database(os.environ.get("TETHER_SQLITE_PATH", str(TETHER_HOME / "tether.sqlite3"))),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": (
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;"
                ),
            },
            "TEST": {"NAME": os.environ.get("TETHER_TEST_DB_NAME", str(TETHER_HOME / "test.sqlite3"))},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# PostgreSQL connections, one budget (tether/dbpool.py; docs/operations.md: Connection budget). A web
# process borrows every connection from a pool of TETHER_WEB_DB_POOL; a request that finds them all in
# use queues for one up to TETHER_WEB_DB_WAIT_SECONDS, then answers 503 "busy" with Retry-After.
# TETHER_DB_RESERVE connections are kept free for an operator's commands (`manage.py loginlink`).
# (The worker processes' pools, TETHER_DB_POOL, are with the loop's settings below.)
TETHER_WEB_DB_POOL = _env_int("TETHER_WEB_DB_POOL", 16)
if TETHER_WEB_DB_POOL < 2:
    raise ImproperlyConfigured(f"TETHER_WEB_DB_POOL must be 2 or more, got {TETHER_WEB_DB_POOL}")
TETHER_WEB_DB_WAIT_SECONDS = _env_float("TETHER_WEB_DB_WAIT_SECONDS", 10)
if TETHER_WEB_DB_WAIT_SECONDS <= 0:
    raise ImproperlyConfigured(f"TETHER_WEB_DB_WAIT_SECONDS must be a positive number, got {TETHER_WEB_DB_WAIT_SECONDS}")
TETHER_DB_RESERVE = _env_int("TETHER_DB_RESERVE", 5)
if TETHER_DB_RESERVE < 0:
    raise ImproperlyConfigured(f"TETHER_DB_RESERVE must be 0 or more, got {TETHER_DB_RESERVE}")

# --- channels ---------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")


def redis_channel_layer(url: str) -> dict[str, Any]:
    """The channels_redis layer on `url`.

    A console socket waits on the layer with a blocking pop that Redis answers after 5 s of quiet;
    redis-py 8 gives every read a 5 s `socket_timeout` by default, so an idle socket's read timed
    out first and the consumer died with 1011. Reads here wait longer than the pop (a dead Redis
    is still noticed, after 30 s)."""
    host = {"address": url, "socket_timeout": 30, "socket_connect_timeout": 5}
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [host], "capacity": 1000, "expiry": 30},
    }


if REDIS_URL:
    CHANNEL_LAYERS = {"default": redis_channel_layer(REDIS_URL)}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- the console (web/console, web/consumers.py) ----------------------------------------------
# How often a console socket reads the database when nothing woke it: with Redis a doorbell wakes it,
# so the poll is only a fallback.
TETHER_CONSOLE_POLL_SECONDS = _env_float("TETHER_CONSOLE_POLL_SECONDS", 2.0 if REDIS_URL else 0.25)
# How often a live, quiet run's socket re-sends its summary.
TETHER_CONSOLE_REFRESH_SECONDS = _env_float("TETHER_CONSOLE_REFRESH_SECONDS", 5.0)
# How long a console action waits for its answer before the page says there was none.
TETHER_CONSOLE_TIMEOUT_SECONDS = _env_float("TETHER_CONSOLE_TIMEOUT_SECONDS", 20.0)
if TETHER_CONSOLE_TIMEOUT_SECONDS <= 0:
    raise ImproperlyConfigured(
        f"TETHER_CONSOLE_TIMEOUT_SECONDS must be a positive number, got {TETHER_CONSOLE_TIMEOUT_SECONDS}"
    )

# --- worker cluster (django-q2, ORM broker in both shapes; see docs/architecture.md) ----
TETHER_WORKERS = _env_int("TETHER_WORKERS", 1)
Q_CLUSTER = {
    "name": "tether",
    "orm": "default",
    # The ORM broker, but a cut connection costs one poll instead of killing the pusher (~10 s).
    "broker_class": "loops.broker.ORMBroker",
    "workers": TETHER_WORKERS,
    "timeout": 60,
    "retry": 120,
    "max_attempts": 0,
    "poll": _env_float("TETHER_QUEUE_POLL", 0.05),
    "recycle": 10**9,
    "catch_up": False,
    "save_limit": 200,
    "ack_failures": True,
    "label": "Worker cluster",
    "log_level": os.environ.get("TETHER_QUEUE_LOG_LEVEL", "WARNING"),
    # Clusters publish their status here, so /readyz and /healthz in a web process can see them.
    "cache": "workers",
}
# A cache every process shares: Redis in the scale-out shape, files under TETHER_HOME otherwise.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "workers": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "tether"}
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(TETHER_HOME / "cache"),
        }
    ),
}

# --- the loop ----------------------------------------------------------------
# Runs one worker process drives at once (threads; acts are I/O-bound).
TETHER_RUNS_PER_WORKER = _env_int("TETHER_RUNS_PER_WORKER", 250)
# A driver's lease on a run; renewed by its heartbeat every third of this.
TETHER_LEASE_SECONDS = _env_float("TETHER_LEASE_SECONDS", 30)
# How often each worker process looks for runs whose lease expired.
TETHER_REAPER_SECONDS = _env_float("TETHER_REAPER_SECONDS", 10)
# How often a driver looks for stop requests on the runs it drives.
TETHER_STOP_POLL_SECONDS = _env_float("TETHER_STOP_POLL_SECONDS", 0.25)
# How often a driver with room claims the runs waiting for one (a batch at a time; see loops.driver).
TETHER_PICKUP_POLL_SECONDS = _env_float("TETHER_PICKUP_POLL_SECONDS", 0.25)
# Events one console pass renders (replays and live alike, the longest-waiting sockets' runs first)
# before it sends them; the runs left go in the next pass, at once, and no state is drawn meanwhile.
TETHER_CONSOLE_EVENTS_PER_PASS = _env_int("TETHER_CONSOLE_EVENTS_PER_PASS", 200)
if TETHER_CONSOLE_EVENTS_PER_PASS < 1:
    raise ImproperlyConfigured(f"TETHER_CONSOLE_EVENTS_PER_PASS must be 1 or more, got {TETHER_CONSOLE_EVENTS_PER_PASS}")
# Runs whose page state (summary, budget, chart) one console pass redraws at most; the others'
# new events still go out in that pass, and their state in the passes right after.
TETHER_CONSOLE_STATES_PER_PASS = _env_int("TETHER_CONSOLE_STATES_PER_PASS", 20)
if TETHER_CONSOLE_STATES_PER_PASS < 1:
    raise ImproperlyConfigured(f"TETHER_CONSOLE_STATES_PER_PASS must be 1 or more, got {TETHER_CONSOLE_STATES_PER_PASS}")
# Runs per worker process that keep their database connection across acts; the
# others give theirs back before every act (PostgreSQL has ~100 connections to share).
TETHER_CONNECTIONS_PER_WORKER = _env_int("TETHER_CONNECTIONS_PER_WORKER", 16)
# ...and how many of the others may hold a connection at once (for their short transactions).
TETHER_DB_GATE_PER_WORKER = _env_int("TETHER_DB_GATE_PER_WORKER", 8)
# On PostgreSQL a worker process pools its connections, at most this many (`tether.dbpool`): a run
# that gives its connection back before its act takes an open one after it. At least (and by default)
# TETHER_CONNECTIONS_PER_WORKER + TETHER_DB_GATE_PER_WORKER + 8; 0: no pool (and no bound).
_POOL_AT_LEAST = TETHER_CONNECTIONS_PER_WORKER + TETHER_DB_GATE_PER_WORKER + 8  # + heartbeat, pickup, claims, acts' writes
TETHER_DB_POOL = _env_int("TETHER_DB_POOL", _POOL_AT_LEAST)
if TETHER_DB_POOL < 0 or 0 < TETHER_DB_POOL < _POOL_AT_LEAST:
    raise ImproperlyConfigured(
        f"TETHER_DB_POOL must be 0 (no pool) or at least {_POOL_AT_LEAST} (TETHER_CONNECTIONS_PER_WORKER + "
        f"TETHER_DB_GATE_PER_WORKER + 8), got {TETHER_DB_POOL}"
    )
# A driver hands a run back to the queue after this long, so work spreads out.
TETHER_SLICE_SECONDS = _env_float("TETHER_SLICE_SECONDS", 60)
# Claims of one iteration before the run is declared crashed.
TETHER_MAX_ATTEMPTS = _env_int("TETHER_MAX_ATTEMPTS", 3)
# How long a driver, its heartbeat and the reaper retry a transaction through transient database
# errors (a cut connection, a serialization failure, a lock timeout) before giving the attempt up.
TETHER_DB_RETRY_SECONDS = _env_float("TETHER_DB_RETRY_SECONDS", 120)
# A driver whose beat (about once a second) was not seen for this long is dead: a stop finishes its run at once.
TETHER_HOLDER_SILENT_SECONDS = _env_float("TETHER_HOLDER_SILENT_SECONDS", 5)
# Whether the workers' cache is shared by every machine (Redis), so a beat from another machine is seen.
TETHER_BEATS_SHARED = os.environ.get("TETHER_BEATS_SHARED", "1" if REDIS_URL else "") == "1"
# The policy that sees progress (loops/policy.py): this many measured iterations without a better
# count of what the checks say is left is a stall (nudge, then escalate, then stop no_progress);
# 0 turns it off (the classic no-progress rules only).
TETHER_STALL_ITERATIONS = _env_int("TETHER_STALL_ITERATIONS", 3)
if TETHER_STALL_ITERATIONS < 0:
    raise ImproperlyConfigured(f"TETHER_STALL_ITERATIONS must be 0 (off) or more, got {TETHER_STALL_ITERATIONS}")
TETHER_ACT_TIMEOUT_SECONDS = _env_float("TETHER_ACT_TIMEOUT_SECONDS", 600)
TETHER_CHECK_TIMEOUT_SECONDS = _env_float("TETHER_CHECK_TIMEOUT_SECONDS", 300)
TETHER_OUTPUT_CAP_BYTES = _env_int("TETHER_OUTPUT_CAP_BYTES", 64 * 1024)
TETHER_WORKSPACES = Path(os.environ.get("TETHER_WORKSPACES", TETHER_HOME / "workspaces")).resolve()
# A run pool leases headroom from its ancestors in slices of this many dollars (budgets/leases.py);
# "0" turns leases off: every reservation then locks the whole pool chain.
TETHER_BUDGET_LEASE_USD = os.environ.get("TETHER_BUDGET_LEASE_USD", "0.25").strip()


def _check_dollars(name: str, value: str) -> None:
    try:
        ok = Decimal(value) >= 0 and Decimal(value).is_finite()
    except InvalidOperation:
        ok = False
    if not ok:
        raise ImproperlyConfigured(f"{name} must be an amount of dollars such as 0.25 (0 or more), got {value!r}")


_check_dollars("TETHER_BUDGET_LEASE_USD", TETHER_BUDGET_LEASE_USD)
# What a `command` agent that reports its own cost reserves per iteration, in dollars.
TETHER_COMMAND_ITERATION_RESERVE_USD = os.environ.get("TETHER_COMMAND_ITERATION_RESERVE_USD", "0.05").strip()
_check_dollars("TETHER_COMMAND_ITERATION_RESERVE_USD", TETHER_COMMAND_ITERATION_RESERVE_USD)
# Brains besides the built-in ones (instances/brains/__init__.py), {kind: "dotted.path.Brain"}, as JSON.
TETHER_BRAINS: dict[str, str] = _env_json("TETHER_BRAINS", {})
# Delegation (loops/delegation.py): how deep a tree of runs may go, children per act, runs per tree.
TETHER_DELEGATION_MAX_DEPTH = _env_int("TETHER_DELEGATION_MAX_DEPTH", 3)
TETHER_DELEGATION_MAX_CHILDREN = _env_int("TETHER_DELEGATION_MAX_CHILDREN", 4)
TETHER_DELEGATION_MAX_RUNS = _env_int("TETHER_DELEGATION_MAX_RUNS", 20)

# --- the Claude brain (instances/brains/anthropic/, the gateway, the judge) -------------------------
# The model of an instance that names none.
TETHER_ANTHROPIC_DEFAULT_MODEL = os.environ.get("TETHER_ANTHROPIC_DEFAULT_MODEL") or "claude-sonnet-5-5"
# A failing model call (429, 529, 5xx, a timeout) is retried this often per act, with jittered
# exponential backoff from BACKOFF to BACKOFF_MAX seconds, before the act ends in `provider_error`.
TETHER_ANTHROPIC_RETRIES = _env_int("TETHER_ANTHROPIC_RETRIES", 4)
TETHER_ANTHROPIC_BACKOFF_SECONDS = _env_float("TETHER_ANTHROPIC_BACKOFF_SECONDS", 1.0)
TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS = _env_float("TETHER_ANTHROPIC_BACKOFF_MAX_SECONDS", 30.0)
TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS = _env_float("TETHER_ANTHROPIC_CALL_TIMEOUT_SECONDS", 300.0)  # a call
TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL = _env_int("TETHER_ANTHROPIC_MAX_TOKENS_PER_CALL", 8192)
# The history's share of a Claude act's (and the `llm` decider's) prompt, in tokens, and how many
# of the latest iterations it keeps whole (applied by the loop, loops/compaction.py).
TETHER_CONTEXT_BUDGET_TOKENS = _env_int("TETHER_CONTEXT_BUDGET_TOKENS", 2000)
TETHER_CONTEXT_RECENT = _env_int("TETHER_CONTEXT_RECENT", 3)

# --- reviews: grading, snapshots, notifications (reviews/) --------------------------------------------
TETHER_JUDGE_TIMEOUT_SECONDS = _env_float("TETHER_JUDGE_TIMEOUT_SECONDS", 120.0)  # one LLM judge call
# The share of verified dones sampled into the review queue, in percent (an instance's grading may
# set its own), and the seed of that draw (empty: derived from the secret key).
TETHER_REVIEW_SAMPLE_PERCENT = _env_json("TETHER_REVIEW_SAMPLE_PERCENT", 10)
if isinstance(TETHER_REVIEW_SAMPLE_PERCENT, bool) or not (
    isinstance(TETHER_REVIEW_SAMPLE_PERCENT, int | float) and 0 <= TETHER_REVIEW_SAMPLE_PERCENT <= 100
):
    raise ImproperlyConfigured(
        f"TETHER_REVIEW_SAMPLE_PERCENT must be a number from 0 to 100, got {TETHER_REVIEW_SAMPLE_PERCENT!r}"
    )
TETHER_REVIEW_SAMPLE_SEED = os.environ.get("TETHER_REVIEW_SAMPLE_SEED", "")
# Templates whose instances are expected to change their workspace when they claim done (JSON list).
TETHER_CODING_TEMPLATES = _env_json("TETHER_CODING_TEMPLATES", ("coder",))
# Where runs' workspace snapshots are kept (one git directory per run), and how big a workspace a
# snapshot takes: its files, then the files .gitignore hides.
TETHER_SNAPSHOTS = Path(os.environ.get("TETHER_SNAPSHOTS") or TETHER_HOME / "snapshots")
TETHER_SNAPSHOT_MAX_BYTES = _env_int("TETHER_SNAPSHOT_MAX_BYTES", 100 * 1024 * 1024)
TETHER_SNAPSHOT_MAX_FILES = _env_int("TETHER_SNAPSHOT_MAX_FILES", 20_000)
TETHER_SNAPSHOT_HIDDEN_MAX_BYTES = _env_int("TETHER_SNAPSHOT_HIDDEN_MAX_BYTES", 20 * 1024 * 1024)
TETHER_SNAPSHOT_HIDDEN_MAX_FILES = _env_int("TETHER_SNAPSHOT_HIDDEN_MAX_FILES", 2_000)
# Notifications by signed webhook: tries per notice, the backoff between them (doubling up to the
# maximum), one call's timeout; and whether a target may be on a private network (JSON true/false).
TETHER_NOTIFY_ATTEMPTS = _env_int("TETHER_NOTIFY_ATTEMPTS", 5)
TETHER_NOTIFY_BACKOFF_SECONDS = _env_float("TETHER_NOTIFY_BACKOFF_SECONDS", 2.0)
TETHER_NOTIFY_BACKOFF_MAX_SECONDS = _env_float("TETHER_NOTIFY_BACKOFF_MAX_SECONDS", 300.0)
TETHER_NOTIFY_TIMEOUT_SECONDS = _env_float("TETHER_NOTIFY_TIMEOUT_SECONDS", 10.0)
TETHER_WEBHOOK_ALLOW_PRIVATE = _env_json("TETHER_WEBHOOK_ALLOW_PRIVATE", False)
# The address links in notifications start with (e.g. https://tether.example); empty: paths only.
TETHER_PUBLIC_URL = os.environ.get("TETHER_PUBLIC_URL", "")

# --- the sandbox (instances/sandbox.py) ------------------------------------------
# "bwrap" (default): every program an agent or a user supplies runs under bubblewrap, and runs
# that need one are refused when it cannot be set up. "off": unsandboxed, for a single-user
# development install only; every page and `serve` warn while it is off.
TETHER_SANDBOX = os.environ.get("TETHER_SANDBOX", "bwrap").strip().lower() or "bwrap"
if TETHER_SANDBOX not in ("bwrap", "off"):
    raise ImproperlyConfigured(f"TETHER_SANDBOX must be 'bwrap' or 'off', got {TETHER_SANDBOX!r}")
TETHER_SANDBOX_MEMORY_MB = _env_int("TETHER_SANDBOX_MEMORY_MB", 4096)  # address space per process
TETHER_SANDBOX_FILE_MB = _env_int("TETHER_SANDBOX_FILE_MB", 1024)  # largest file it may write
TETHER_SANDBOX_TMP_MB = _env_int("TETHER_SANDBOX_TMP_MB", 512)  # its private /tmp
# 1: a sandboxed Python runs the interpreter's bytecode compiled once by the server (instances/bytecode.py),
# mounted read-only; 0: every sandbox compiles what it imports (slower; for comparing, see bench.sandbox_bench).
TETHER_SANDBOX_BYTECODE = _env_int("TETHER_SANDBOX_BYTECODE", 1) != 0
TETHER_SANDBOX_MAX_PROCESSES = _env_int("TETHER_SANDBOX_MAX_PROCESSES", 256)  # per instance (server as root)
# Directories of programs (agent CLIs, scripts installed outside /usr) every sandbox sees
# read-only at the same path; separated by ":".
TETHER_SANDBOX_PROGRAMS = [p for p in os.environ.get("TETHER_SANDBOX_PROGRAMS", "").split(":") if p.strip()]
# Running as root, an instance's programs run as uid TETHER_SANDBOX_UID_BASE + its id.
TETHER_SANDBOX_UID_BASE = _env_int("TETHER_SANDBOX_UID_BASE", 200_000)
# Directories (besides TETHER_WORKSPACES/<user>/) where a user with the run_programs capability
# may place an instance's workspace; separated by ":".
TETHER_WORKSPACE_ROOTS = [
    Path(p).resolve() for p in os.environ.get("TETHER_WORKSPACE_ROOTS", "").split(":") if p.strip()
]
# Let instances' base_url name loopback, link-local or private hosts (a local model gateway).
TETHER_ALLOW_PRIVATE_BASE_URLS = os.environ.get("TETHER_ALLOW_PRIVATE_BASE_URLS", "") == "1"

# --- operations ----------------------------------------------------------------
# Bearer token for /metrics (Prometheus); empty: the endpoint is off.
TETHER_METRICS_TOKEN = os.environ.get("TETHER_METRICS_TOKEN", "")
# How soon a key stored by another process is redacted here: the stored keys are re-read this often.
TETHER_REDACTION_REFRESH_SECONDS = _env_float("TETHER_REDACTION_REFRESH_SECONDS", 5.0)
# Traces (tether/tracing.py) go out when OTEL_EXPORTER_OTLP_ENDPOINT is set; prompt and completion
# text go with them only when this is 1 (then redacted).
TETHER_OTEL_CAPTURE_CONTENT = os.environ.get("TETHER_OTEL_CAPTURE_CONTENT", "") == "1"

# --- auth & static -----------------------------------------------------------
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = TETHER_HOME / "static"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True
# Collected static files carry hashed names, a gzip copy, and a far-future cache (see tether/staticfiles.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "tether.staticfiles.HashedStaticStorage"},
}
SESSION_COOKIE_HTTPONLY = True

# --- sign-in, sessions and browser security ------------------------------------
# Password sign-in (console and admin) is throttled by django-axes: after
# TETHER_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address, that
# pair is refused (429) until TETHER_LOGIN_COOLOFF_SECONDS pass with no further try.
# Other users and other addresses are not affected. A one-time sign-in link
# (manage.py loginlink) still signs in and clears the count.
TETHER_LOGIN_FAILURE_LIMIT = _env_int("TETHER_LOGIN_FAILURE_LIMIT", 5)
TETHER_LOGIN_COOLOFF_SECONDS = _env_float("TETHER_LOGIN_COOLOFF_SECONDS", 15 * 60)
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = "web.accounts.login_failure_limit"
AXES_COOLOFF_TIME = "web.accounts.login_cool_off"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "web.accounts.lockout_response"
AXES_VERBOSE = False  # no banner on every manage.py command; lockouts are still logged
# Open console sockets re-check their sign-in this often (sign-out, deactivation,
# password change close them).
TETHER_WS_AUTH_RECHECK_SECONDS = _env_float("TETHER_WS_AUTH_RECHECK_SECONDS", 5)
# Deployments behind TLS: Secure cookies, HSTS, and trust the proxy's X-Forwarded-Proto.
TETHER_SECURE_COOKIES = os.environ.get("TETHER_SECURE_COOKIES", "") == "1"
if TETHER_SECURE_COOKIES:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _env_int("TETHER_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# No inline script or style anywhere: the console's JavaScript and CSS are static files.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

# E-mail (notifications, digests), through Django's mailers: printed to the console unless
# TETHER_EMAIL_BACKEND names another backend, e.g. django.core.mail.backends.smtp.EmailBackend with
# TETHER_EMAIL_HOST, TETHER_EMAIL_PORT, TETHER_EMAIL_USERNAME, TETHER_EMAIL_PASSWORD, TETHER_EMAIL_USE_TLS.
_EMAIL_BACKEND = os.environ.get("TETHER_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
MAILERS = {
    "default": {
        "BACKEND": _EMAIL_BACKEND,
        "OPTIONS": {
            "host": os.environ.get("TETHER_EMAIL_HOST", "localhost"),
            "port": _env_int("TETHER_EMAIL_PORT", 25),
            "username": os.environ.get("TETHER_EMAIL_USERNAME", ""),
            "password": os.environ.get("TETHER_EMAIL_PASSWORD", ""),
            "use_tls": os.environ.get("TETHER_EMAIL_USE_TLS", "") in ("1", "true", "yes"),
        }
        if _EMAIL_BACKEND.endswith("smtp.EmailBackend")
        else {},
    }
}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "tether@localhost")
# The review watch (reviews.watch) and digests (reviews.digest).
TETHER_REVIEW_MAX_WAIT_HOURS = _env_float("TETHER_REVIEW_MAX_WAIT_HOURS", 24)
TETHER_REVIEW_MAX_BACKLOG = _env_int("TETHER_REVIEW_MAX_BACKLOG", 50)
TETHER_REVIEW_QUICK_SECONDS = _env_float("TETHER_REVIEW_QUICK_SECONDS", 10)
TETHER_REVIEW_STREAK = _env_int("TETHER_REVIEW_STREAK", 20)
TETHER_REVIEW_SAMPLE_BOOST_PERCENT = _env_float("TETHER_REVIEW_SAMPLE_BOOST_PERCENT", 25)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "tether.jsonlog.PlainFormatter", "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "tether.jsonlog.JsonFormatter"},
    },
    # TETHER_LOG_FORMAT=json: one JSON object per line, with run and iteration ids when known.
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if os.environ.get("TETHER_LOG_FORMAT", "").lower() == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("TETHER_LOG_LEVEL", "INFO")},
    "loggers": {"django_q": {"level": os.environ.get("TETHER_QUEUE_LOG_LEVEL", "WARNING")}},
}
