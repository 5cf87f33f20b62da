#!/usr/bin/env bash
# agl's rollout workload through the peer, Microsoft's Agent Lightning 0.3.0 (benchmarks/peer/bench_peer.py; its
# docstring says how the workload maps onto the peer and what differs). Makes .venv-peer from
# benchmarks/peer/requirements.txt when it is missing or out of date, then runs the benchmark with it; the fake
# backend is agl's, started with .venv (bash scripts/env.sh). About 2 minutes; writes
# benchmarks/results/peer-rollouts.json.
#
#   bash benchmarks/bench_peer.sh                    # 8 runners, 64 rollouts per batch, 3 warm batches
#   bash benchmarks/bench_peer.sh --poll-interval 0.5 --log -    # any bench_peer.py option
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-peer"
REQ="$ROOT/benchmarks/peer/requirements.txt"
STAMP="$VENV/.requirements.sha256"
WANT="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[agl] installing the peer (agentlightning 0.3.0) into .venv-peer from benchmarks/peer/requirements.txt" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  # (grep: this machine's pip config names index folders that may be absent; pip warns once per package)
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q -r "$REQ" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  echo "$WANT" >"$STAMP"
fi
if [ ! -x "$ROOT/.venv/bin/python" ] && [[ " $* " != *" --backend"* ]]; then
  echo "[agl] .venv is missing: the fake backend runs with agl's venv (bash scripts/env.sh), or pass --backend URL" >&2
  exit 1
fi
echo "# $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg) before the peer's run"
"$VENV/bin/python" "$ROOT/benchmarks/peer/bench_peer.py" "$@"
