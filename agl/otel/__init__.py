"""OpenTelemetry out and in: export agl's rollouts as OTLP traces (GenAI conventions + OpenInference), and import
traces of agents that ran without agl as rollouts the trainers can learn from.

Names load lazily; the OpenTelemetry SDK is imported only when spans are sent (extra ``otel``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

if TYPE_CHECKING:
    from agl.otel.export import ExportFailed, ExportReport, LiveExporter, export_spans
    from agl.otel.importer import ImportReport, import_traces, read_mlflow, read_otlp_json, read_phoenix
    from agl.otel.offline import NotTrainable, stored_trajectories

_EXPORTS = {
    "ExportFailed": "agl.otel.export",
    "ExportReport": "agl.otel.export",
    "LiveExporter": "agl.otel.export",
    "export_spans": "agl.otel.export",
    "ImportReport": "agl.otel.importer",
    "import_traces": "agl.otel.importer",
    "read_mlflow": "agl.otel.importer",
    "read_otlp_json": "agl.otel.importer",
    "read_phoenix": "agl.otel.importer",
    "NotTrainable": "agl.otel.offline",
    "stored_trajectories": "agl.otel.offline",
}

__all__ = [
    "ExportFailed",
    "ExportReport",
    "ImportReport",
    "LiveExporter",
    "NotTrainable",
    "export_spans",
    "import_traces",
    "read_mlflow",
    "read_otlp_json",
    "read_phoenix",
    "stored_trajectories",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
