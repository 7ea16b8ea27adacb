"""Tether's one settings file, driven by the environment.

Embedded default: SQLite under TETHER_HOME and the django-q2 ORM broker.
Scale-out: DATABASE_URL (PostgreSQL) and REDIS_URL (the channels_redis layer).
"""

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
TETHER_HOME = Path(os.environ.get("TETHER_HOME", BASE_DIR / "var")).resolve()
TETHER_HOME.mkdir(parents=True, exist_ok=True)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {raw!r}") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None


def _secret_key() -> str:
    if key := os.environ.get("TETHER_SECRET_KEY"):
        return key
    path = TETHER_HOME / "secret_key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
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
    "instances",
    "budgets",
    "loops",
    "reviews",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
            ],
        },
    },
]

# --- database -------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    import dj_database_url

    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    if _db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(f"DATABASE_URL must point at PostgreSQL (postgres://...), got {_db['ENGINE']}")
    _db.setdefault("TEST", {})
    if name := os.environ.get("TETHER_TEST_DB_NAME"):
        _db["TEST"]["NAME"] = name
    DATABASES = {"default": _db}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("TETHER_SQLITE_PATH", str(TETHER_HOME / "tether.sqlite3")),
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

# --- channels ---------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 1000, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- worker cluster (django-q2, ORM broker in both shapes; see DESIGN.md) ----
TETHER_WORKERS = _env_int("TETHER_WORKERS", 1)
Q_CLUSTER = {
    "name": "tether",
    "orm": "default",
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
# Runs per worker process that keep their database connection across acts; the
# others give theirs back before every act (PostgreSQL has ~100 connections to share).
TETHER_CONNECTIONS_PER_WORKER = _env_int("TETHER_CONNECTIONS_PER_WORKER", 16)
# ...and how many of the others may hold a connection at once (for their short transactions).
# Keep (this + the above) × worker processes + web processes under the server's max_connections.
TETHER_DB_GATE_PER_WORKER = _env_int("TETHER_DB_GATE_PER_WORKER", 8)
# A driver hands a run back to the queue after this long, so work spreads out.
TETHER_SLICE_SECONDS = _env_float("TETHER_SLICE_SECONDS", 60)
# Claims of one iteration before the run is declared crashed.
TETHER_MAX_ATTEMPTS = _env_int("TETHER_MAX_ATTEMPTS", 3)
TETHER_ACT_TIMEOUT_SECONDS = _env_float("TETHER_ACT_TIMEOUT_SECONDS", 600)
TETHER_CHECK_TIMEOUT_SECONDS = _env_float("TETHER_CHECK_TIMEOUT_SECONDS", 300)
TETHER_OUTPUT_CAP_BYTES = _env_int("TETHER_OUTPUT_CAP_BYTES", 64 * 1024)
TETHER_WORKSPACES = Path(os.environ.get("TETHER_WORKSPACES", TETHER_HOME / "workspaces")).resolve()

# --- operations ----------------------------------------------------------------
# Bearer token for /metrics (Prometheus); empty: the endpoint is off.
TETHER_METRICS_TOKEN = os.environ.get("TETHER_METRICS_TOKEN", "")

# --- auth & static -----------------------------------------------------------
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = TETHER_HOME / "static"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True
SESSION_COOKIE_HTTPONLY = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
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

# Every other TETHER_* variable in the environment becomes a setting of the same name
# (JSON-decoded when it parses: numbers, true/false), so tuning knobs read by the
# apps with getattr(settings, NAME, default) can be set without editing this file.
def _extra_settings() -> None:
    import json

    known = globals()
    for name, raw in os.environ.items():
        if not name.startswith("TETHER_") or name in known:
            continue
        try:
            known[name] = json.loads(raw)
        except ValueError:
            known[name] = raw


_extra_settings()
