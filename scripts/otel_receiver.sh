#!/usr/bin/env bash
# The OTLP receiver the OpenTelemetry tests export to and import from: Arize Phoenix, in its own venv (.venv-otel)
# because its pins (protobuf, sqlalchemy, ...) are not the agent frameworks'. Idempotent: does nothing once installed.
# Usage: bash scripts/otel_receiver.sh   (then tests find .venv-otel/bin/phoenix)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-otel"
PHOENIX_VERSION="20.26.1"
if [ -x "$VENV/bin/phoenix" ] && "$VENV/bin/python" -c "import phoenix, sys; sys.exit(phoenix.__version__ != '$PHOENIX_VERSION')" 2>/dev/null; then
  exit 0
fi
echo "[agl] installing arize-phoenix $PHOENIX_VERSION into .venv-otel (the OTLP receiver of the OpenTelemetry tests)" >&2
PY="${PYTHON:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "arize-phoenix==$PHOENIX_VERSION"
