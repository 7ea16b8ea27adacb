"""OpenTelemetry's modules, in one place, for `tether.tracing` alone (through its `_otel()`).

Importing them takes ~0.3 s, so this module is imported only once tracing is on: a process with
tracing off never loads OpenTelemetry.
"""

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.sdk import resources
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import export, id_generator

__all__ = ["context", "export", "id_generator", "resources", "sdk_trace", "trace", "trace_exporter"]
