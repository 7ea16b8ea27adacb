"""Traces: each run as one OpenTelemetry trace, exported over OTLP/HTTP when an endpoint is set.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
exporter reads the standard `OTEL_*` variables (headers, timeout, `OTEL_SERVICE_NAME`). Spans
leave through a `BatchSpanProcessor`: a background thread sends them, so a slow or down
collector never slows or fails a run; what could not be sent, and what its full queue
(`OTEL_BSP_MAX_QUEUE_SIZE`) turned away, is counted (`tether_trace_spans_dropped_total` on
`/metrics`, in the shared `workers` cache so every process adds to one figure).

One trace per run, stitched across workers and restarts: the trace id and the run span's id
are derived from the run (`run_ids`), never kept in a process. Each iteration's span is a child
of the run span wherever it runs; the run span itself is written once, when the run finishes,
from its recorded start and end. A delegated run is in its root run's trace, its run span a
child of its parent's. Under an iteration: `act`, `checks`, `decider`, `judge`, each model call
(`gen_ai.*` attributes of the GenAI semantic conventions, and `tether.cost_usd`) and each tool call.
A `command` agent's model calls, served by the metering gateway in another thread, are opened
under the act's span taken where the act runs (`current`, `model_call_started`). An iteration
whose worker died in it (its span died unended with the process) is written once its attempt is
recorded lost (`iteration_lost`), from its recorded start, status error "worker lost".

Prompt and completion text are never exported unless `TETHER_OTEL_CAPTURE_CONTENT` is on, and
then they are redacted (`tether.redaction`, with the caller's own secrets: `content`) and bounded.

The callers (the runner, the brains, the gateway) make thin calls: `iteration`, `span`,
`model_call`, `model_call_started`, `iteration_lost`, `run_finished`. Every one is a no-op, at
the cost of one check, when tracing is off. OpenTelemetry itself (`tether.otel`) is imported only
once tracing is on, by `_otel`.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.cache import caches

from tether.redaction import redact

log = logging.getLogger(__name__)

DROPPED_KEY = "otel:spans_dropped"
CONTENT_MAX_CHARS = 4000
SERVICE = "tether"
# The span id the next span started in this context takes (the run span's, derived from the run).
_forced_span_id: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tether_forced_span", default=None
)
_forced_trace_id: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tether_forced_trace", default=None
)

_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None


def enabled() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def capture_content() -> bool:
    return bool(settings.TETHER_OTEL_CAPTURE_CONTENT)


def _count_dropped(count: int) -> None:
    try:
        cache = caches["workers"]
        cache.add(DROPPED_KEY, 0, timeout=None)
        cache.incr(DROPPED_KEY, count)
    except Exception:  # noqa: BLE001 - counting must never fail the exporter's thread
        log.debug("could not count %d dropped spans", count)


def dropped() -> int:
    """How many spans could not be exported (every process's, since the cache was last cleared)."""
    try:
        return int(caches["workers"].get(DROPPED_KEY) or 0)
    except Exception:  # noqa: BLE001 - a metrics scrape reads what it can
        return 0


@functools.cache
def _otel() -> ModuleType:
    """OpenTelemetry's modules (`tether.otel`), imported on first use: never while tracing is off."""
    from tether import otel  # lazy: OpenTelemetry (~0.3 s to import) only once tracing is on

    return otel


def _build() -> Any:
    otel = _otel()
    export = otel.export

    SpanExporter, SpanExportResult = export.SpanExporter, export.SpanExportResult

    class Ids(otel.id_generator.RandomIdGenerator):
        """Random ids, except where the run decides them (its trace, its run span)."""

        def generate_span_id(self) -> int:
            return _forced_span_id.get() or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _forced_trace_id.get() or super().generate_trace_id()

    class Counting(SpanExporter):
        """The OTLP exporter, counting the spans it could not send."""

        def __init__(self, inner: SpanExporter) -> None:
            self.inner = inner

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            try:
                result = self.inner.export(spans)
            except Exception:  # noqa: BLE001 - a collector's failure is counted, never raised into a run
                result = SpanExportResult.FAILURE
            if result != SpanExportResult.SUCCESS:
                _count_dropped(len(spans))
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(self.inner.force_flush(timeout_millis))

    class Queue(export.BatchSpanProcessor):
        """The batch processor, counting the spans its full queue turns away (or that end after shutdown).

        The SDK reports each such span to its processor metrics (`drop_items`); those are counted here too.
        """

        def __init__(self, exporter: SpanExporter) -> None:
            super().__init__(exporter)
            batch = getattr(self, "_batch_processor", None)
            sdk_metrics = getattr(batch, "_metrics", None)
            if (
                sdk_metrics is None
            ):  # an SDK older than the hook: exports still work, queue drops go uncounted
                log.warning("this OpenTelemetry SDK does not report queue drops; they are not counted")
                return

            class Metrics:
                def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
                    sdk_metrics.register_queue_size(get_queue_size)

                def drop_items(self, count: int, error_type: str = "queue_full") -> None:
                    _count_dropped(count)
                    sdk_metrics.drop_items(count, error_type)

                def finish_items(self, count: int) -> None:
                    sdk_metrics.finish_items(count)

            batch._metrics = Metrics()

    resource = otel.resources.Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE})
    provider = otel.sdk_trace.TracerProvider(resource=resource, id_generator=Ids())
    provider.add_span_processor(Queue(Counting(otel.trace_exporter.OTLPSpanExporter())))
    return provider


def tracer() -> Any:
    """This process's tracer (built on first use), or None when tracing is off."""
    global _tracer, _provider
    if not enabled():
        return None
    with _lock:
        if _tracer is None:
            _provider = _build()
            _tracer = _provider.get_tracer("tether")
        return _tracer


def flush(timeout_seconds: float = 5.0) -> bool:
    """Send what is buffered now (tests, a clean stop); True when it went or there was nothing."""
    return bool(_provider.force_flush(int(timeout_seconds * 1000))) if _provider is not None else True


def reset() -> None:
    """Forget this process's tracer (tests change the endpoint), after sending what it holds."""
    global _tracer, _provider
    with _lock:
        if _provider is not None:
            _provider.shutdown()
        _tracer = _provider = None


# --- ids: derived from the run --------------------------------------------------------------------


@dataclass(frozen=True)
class RunIds:
    trace_id: int
    span_id: int
    parent_span_id: int | None  # the parent run's span (a delegated run)


def _derived(*parts: object, bits: int) -> int:
    digest = hashlib.sha256("\x00".join(str(p) for p in ("tether-trace", *parts)).encode()).digest()
    return int.from_bytes(digest[: bits // 8], "big") or 1


def run_key(run_id: int, created_at: datetime | None) -> str:
    """What names a run for its ids: its id and when it was made (ids are reused by other databases)."""
    return f"{run_id}@{created_at.isoformat() if created_at else ''}"


def run_ids(run_key_: str, root_key: str, parent_key: str | None) -> RunIds:
    """The run's trace id (its root run's), its run span's id, and its parent run's span id."""
    return RunIds(
        trace_id=_derived("trace", root_key, bits=128),
        span_id=_derived("run", run_key_, bits=64),
        parent_span_id=_derived("run", parent_key, bits=64) if parent_key else None,
    )


def _remote(trace_id: int, span_id: int) -> Any:
    trace = _otel().trace
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    context = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def _ns(when: datetime | None) -> int | None:
    return int(when.timestamp() * 1_000_000_000) if when else None


# --- spans ----------------------------------------------------------------------------------------


class Span:
    """What a caller may add to an open span (nothing happens when tracing is off)."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def set(self, **attributes: Any) -> None:
        if self.span is None:
            return
        for name, value in attributes.items():
            if value is not None:
                self.span.set_attribute(name.replace("__", "."), value)

    def error(self, description: str) -> None:
        if self.span is not None:
            trace = _otel().trace
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, description[:300]))

    def end(self, when: datetime | None = None) -> None:
        """End a span opened without a block (`model_call_started`, a lost iteration's)."""
        if self.span is not None:
            self.span.end(end_time=_ns(when))


def current() -> Any:
    """The current span's context, for spans another thread opens under it (None when tracing is off)."""
    if tracer() is None:
        return None
    return _otel().context.get_current()


def _iteration(number: int, run_id: int, attempt: int) -> tuple[str, dict[str, Any]]:
    """An iteration span's name and attributes (its own, or a lost one's)."""
    return f"iteration {number}", {"tether.run_id": run_id, "tether.iteration": number, "tether.attempt": attempt}


@contextmanager
def iteration(run_ids_of: Callable[[], RunIds], run_id: int, number: int, attempt: int = 1) -> Iterator[Span]:
    """The span of one iteration, a child of the run span (wherever the run span is written).

    `run_ids_of` is only called when tracing is on (it may read the run's delegation chain).
    """
    found = tracer()
    if found is None:
        yield Span()
        return
    ids = run_ids_of()
    name, attributes = _iteration(number, run_id, attempt)
    with found.start_as_current_span(
        name, context=_remote(ids.trace_id, ids.span_id), attributes=attributes
    ) as span:
        yield Span(span)


def iteration_lost(
    ids: RunIds, run_id: int, number: int, attempt: int, *, started: datetime, lost: datetime, worker: str
) -> None:
    """Write the span of an iteration whose worker died in it (its own span died with that process).

    From what was recorded: when it began, when its loss was found; under the run span, status error.
    """
    found = tracer()
    if found is None:
        return
    name, attributes = _iteration(number, run_id, attempt)
    opened = Span(
        found.start_span(name, context=_remote(ids.trace_id, ids.span_id), start_time=_ns(started), attributes=attributes)
    )
    opened.set(tether__worker=worker, tether__lost=True)
    opened.error("worker lost")
    opened.end(lost)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Span]:
    """A span under the current one (an act, the checks, the decider, the judge, a tool call)."""
    found = tracer()
    if found is None:
        yield Span()
        return
    with found.start_as_current_span(name) as opened:
        wrapped = Span(opened)
        wrapped.set(**attributes)
        yield wrapped


def content(value: object, secrets: Sequence[str] = ()) -> str | None:
    """Prompt or completion as a span may carry it: None unless allowed, then as JSON, redacted and bounded.

    Serialised only when content capture is on (a call's messages can be large). Redacted of the
    server's keys and of `secrets`: what the call's own session keeps out of its texts (its key, its
    MCP servers' secrets, which no global list holds).
    """
    if not capture_content():
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return redact(text, tuple(secrets))[:CONTENT_MAX_CHARS]


def _model_call(system: str, model: str, operation: str) -> tuple[str, dict[str, Any]]:
    """A model call span's name and the GenAI semantic conventions' request attributes."""
    return f"{operation} {model}", {
        "gen_ai__system": system,
        "gen_ai__provider__name": system,
        "gen_ai__operation__name": operation,
        "gen_ai__request__model": model,
    }


@contextmanager
def model_call(system: str, model: str, operation: str = "chat") -> Iterator[Span]:
    """A model call's span under the current one; the caller adds usage (`brains.base.trace_call`)."""
    name, attributes = _model_call(system, model, operation)
    with span(name, **attributes) as opened:
        yield opened


def model_call_started(parent: Any, system: str, model: str, operation: str = "chat") -> Span:
    """A model call's span under `parent` (`current()` where the act runs), for a call served in
    another thread (the gateway's); the caller adds usage and ends it (`Span.end`)."""
    found = tracer()
    if found is None or parent is None:
        return Span()
    name, attributes = _model_call(system, model, operation)
    opened = Span(found.start_span(name, context=parent))
    opened.set(**attributes)
    return opened


def run_finished(
    ids: RunIds,
    run_id: int,
    *,
    started: datetime | None,
    finished: datetime | None,
    attributes: dict[str, Any],
) -> None:
    """Write the run span once the run finished, from its recorded times, with the ids derived from the run."""
    found = tracer()
    if found is None:
        return
    otel_context = _otel().context
    # Never the current context: a run finishes inside its last iteration's span.
    context = _remote(ids.trace_id, ids.parent_span_id) if ids.parent_span_id else otel_context.Context()
    span_token = _forced_span_id.set(ids.span_id)
    trace_token = _forced_trace_id.set(ids.trace_id)
    try:
        opened = found.start_span(
            f"run {run_id}", context=context, start_time=_ns(started), attributes={"tether.run_id": run_id}
        )
    finally:
        _forced_span_id.reset(span_token)
        _forced_trace_id.reset(trace_token)
    Span(opened).set(**attributes)
    opened.end(end_time=_ns(finished))
