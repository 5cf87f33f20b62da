#!/usr/bin/env bash
# The main job: train the LangGraph SQL agent on CPU (Qwen2.5-Coder-0.5B, LightningRL from the base model) and print
# the accuracy of the base and trained policies on the test and independent databases, with paired differences and
# their 95% intervals.
# Installs what it needs into .venv first. Extra args go to the demo, e.g. --quick or --budget-min 60.
set -euo pipefail
# The demo's time budget counts from here, the install included (examples/sql_agent/train.py reads it).
export AGL_DEMO_STARTED="${AGL_DEMO_STARTED:-$(date +%s.%N)}"
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
python -m examples.sql_agent.train "$@"
