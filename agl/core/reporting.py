"""Where metrics go besides the store and ``metrics.jsonl``: the ``report_to`` writers (TensorBoard, MLflow, W&B;
checked and opened by ``agl.report_writers``), and the console warning for a round whose failure rate jumps.

Owned by one Trainer and called from its thread only (no locks). Each writer opens at the first metrics it gets and
is closed by ``Trainer.close()``; a later ``fit`` opens a new one (a new TensorBoard folder, MLflow run, W&B run).
The writers live above core and are imported only when ``report_to`` names one, so core and ``import agl`` stay light.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agl.report_writers import Writer

log = logging.getLogger("agl.reporting")


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The values the writers take: ints and floats (not bools); strings and other values are left out."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class Reporter:
    """Sends each ``log_metrics`` call's numeric metrics to the writers named in ``report_to``."""

    def __init__(self, report_to: str | Sequence[str] | None, run_dir: Path) -> None:
        self.names: list[str] = []
        if report_to is not None:
            from agl.report_writers import parse_report_to  # above core, only when asked

            self.names = parse_report_to(report_to)
        self.run_dir = run_dir
        self._writers: dict[str, Writer] = {}

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        values = numeric_metrics(metrics)
        if not values:
            return
        for name in self.names:
            writer = self._writers.get(name)
            if writer is None:
                from agl.report_writers import open_writer

                writer = self._writers[name] = open_writer(name, self.run_dir)
                print(f"[agl] metrics also go to {name}: {writer.where}", file=sys.stderr, flush=True)
            writer.write(step, values, wall_time)

    def close(self) -> None:
        """Flush and close every open writer (each one, even when another fails); the first failure is raised, the
        others logged."""
        writers, self._writers = list(self._writers.items()), {}
        errors: list[BaseException] = []
        for name, writer in writers:
            try:
                writer.close()
            except Exception as exc:
                if errors:
                    log.error("report_to %s: closing its writer failed: %s", name, exc)
                errors.append(exc)
        if errors:
            raise errors[0]


class FailureWatch:
    """Flags a round whose failure rate jumps: a round is what ran between two ``log_metrics`` calls; its failure
    rate is failed or cancelled rollouts (lost ones end failed) over its rollouts. It is flagged when it is at least
    ``factor`` times the mean rate of the earlier rounds and at least ``min_rise`` above it (so after clean rounds,
    ``min_rise`` alone decides; the first round has nothing to compare with)."""

    def __init__(self, factor: float = 2.0, min_rise: float = 0.10) -> None:
        self.factor, self.min_rise = factor, min_rise
        self.rates: list[float] = []
        self._rollouts = self._failed = 0

    def add(self, statuses: Sequence[str]) -> None:
        """Count a batch's rollout statuses into the current round."""
        self._rollouts += len(statuses)
        self._failed += sum(s in ("failed", "cancelled") for s in statuses)

    def end_round(self, step: int) -> str | None:
        """Close the current round; the warning line when its failure rate jumped, else None."""
        n, failed = self._rollouts, self._failed
        self._rollouts = self._failed = 0
        if not n:
            return None
        rate = failed / n
        before = sum(self.rates) / len(self.rates) if self.rates else math.nan
        self.rates.append(rate)
        if math.isnan(before) or rate < self.factor * before or rate - before < self.min_rise:
            return None
        return (
            f"[agl] warning: step {step}: {failed}/{n} rollouts failed ({rate:.0%}), up from {before:.0%} on average "
            f"in the {len(self.rates) - 1} earlier round(s); see `agl runs` / `agl show` for their errors"
        )
