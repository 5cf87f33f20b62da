#!/usr/bin/env bash
# The test command: installs what the tests need into .venv, then runs the whole suite. Extra args go to pytest
# (e.g. `-m "not slow"` for the quick loop, `-k serving`). The slowest tests are listed at the end of every run.
set -euo pipefail
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m pytest -q -p no:cacheprovider --durations=15 "$@"
