"""The demo's time plan, made from speeds measured in the run itself (not from defaults tuned on another machine).

The evaluations are fixed costs: every method is measured on the whole test split and the independent group, so
they cannot shrink. What the budget leaves after the evaluations still to come (their time estimated from the
evaluation speed just measured) is split between the warm start and LightningRL, the warm start capped at
``sft_share`` of it so RL always gets the larger part; whatever the warm start leaves unused goes to RL too.
When the evaluations alone would use the budget, training still gets ``min_train_share`` of the budget and the plan
says that the run will end late. Pure functions, no clock: the caller passes what it measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Evaluation time estimates are multiplied by this: a later evaluation of a trained policy can be a little slower.
EVAL_SAFETY = 1.15
#: Seconds kept after the last evaluation for what ends the run: the paired comparisons, report, plot and the
#: shutdown of the policy server and store (a newcomer's run with nothing kept for it ended about 12 s past its budget).
CLOSING_S = 60.0


@dataclass(frozen=True)
class Plan:
    """Seconds for each phase still to run, and why."""

    budget_s: float
    elapsed_s: float
    eval_questions_left: int
    eval_s_per_question: float
    eval_reserve_s: float
    training_s: float
    sft_cap_s: float
    rl_s: float
    over_budget: bool

    @property
    def rl_share(self) -> float:
        """RL's part of the training time (the time not reserved for evaluations)."""
        return self.rl_s / self.training_s if self.training_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rl_share": self.rl_share}

    def describe(self) -> str:
        """One paragraph for the console and report.md."""
        text = (
            f"{self.elapsed_s / 60:.1f} of {self.budget_s / 60:.1f} min used; evaluation measured at "
            f"{self.eval_s_per_question:.2f} s/question, so the {self.eval_questions_left} evaluation questions still "
            f"to run and the closing report are given {self.eval_reserve_s / 60:.1f} min (×{EVAL_SAFETY} margin, "
            f"{CLOSING_S:.0f} s to close); training gets the other "
            f"{self.training_s / 60:.1f} min: "
        )
        if self.sft_cap_s > 0:
            text += f"warm start at most {self.sft_cap_s / 60:.1f} min, LightningRL at least {self.rl_s / 60:.1f} min "
        else:
            text += f"LightningRL {self.rl_s / 60:.1f} min "
        text += f"({self.rl_share:.0%} to RL)."
        if self.over_budget:
            text += (
                " The evaluations alone need about the whole budget on this machine: training gets a minimum share "
                "and the run ends after its budget (raise --budget-min, or use a faster machine)."
            )
        return text


def plan_budget(
    budget_s: float,
    elapsed_s: float,
    eval_questions_left: int,
    eval_s_per_question: float,
    *,
    warm_start: bool,
    sft_share: float = 0.4,
    min_train_share: float = 0.25,
) -> Plan:
    """Split what is left of ``budget_s`` after ``elapsed_s`` and the evaluations still to come.

    ``warm_start``: a warm start still has to run (it gets at most ``sft_share`` of the training time, which must be
    below one half so RL gets the larger share); False when only RL is left. ``min_train_share``: the least part of
    the whole budget training gets even when the evaluations use it all.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s: must be > 0, got {budget_s}")
    if not 0 <= sft_share < 0.5:
        raise ValueError(f"sft_share: must be in [0, 0.5) so RL gets the larger share, got {sft_share}")
    if eval_questions_left < 0 or eval_s_per_question < 0:
        raise ValueError("eval_questions_left and eval_s_per_question must be >= 0")
    reserve = eval_questions_left * eval_s_per_question * EVAL_SAFETY + CLOSING_S
    training = budget_s - elapsed_s - reserve
    floor = min_train_share * budget_s
    over = training < floor
    training = max(training, floor)
    sft_cap = sft_share * training if warm_start else 0.0
    return Plan(
        budget_s=budget_s,
        elapsed_s=elapsed_s,
        eval_questions_left=eval_questions_left,
        eval_s_per_question=eval_s_per_question,
        eval_reserve_s=reserve,
        training_s=training,
        sft_cap_s=sft_cap,
        rl_s=training - sft_cap,
        over_budget=over,
    )
