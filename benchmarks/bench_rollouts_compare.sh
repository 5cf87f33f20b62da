#!/usr/bin/env bash
# agl's rollout benchmark before -> after in one run: the tree at REV (a temporary git worktree, run with this venv)
# and then this tree, back to back on the same machine; the peer on the same workload last, when the peer tool is
# there (benchmarks/bench_peer.sh). Needs .venv (bash scripts/env.sh).
#
#   bash benchmarks/bench_rollouts_compare.sh REV                       # SQLite, 8/32/64 runners (about 10 minutes)
#   bash benchmarks/bench_rollouts_compare.sh REV --store postgresql    # any bench_rollouts option
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${1:?usage: bench_rollouts_compare.sh REV [bench_rollouts options]}"
shift
PY="$ROOT/.venv/bin/python"
TREE="$(mktemp -d)"
git -C "$ROOT" worktree add --detach --force "$TREE" "$REV" >/dev/null
trap 'git -C "$ROOT" worktree remove --force "$TREE"' EXIT
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# before: $REV = $(git -C "$ROOT" rev-parse --short "$REV")"
(cd "$TREE" && PYTHONPATH="$TREE" "$PY" -m benchmarks.bench_rollouts --out "$TREE/results" "$@")
echo "# after: this tree ($(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ', with changes'))"
(cd "$ROOT" && "$PY" -m benchmarks.bench_rollouts "$@")
if [ -f "$ROOT/benchmarks/bench_peer.sh" ]; then
  echo "# the peer on the same workload"
  bash "$ROOT/benchmarks/bench_peer.sh"
fi
