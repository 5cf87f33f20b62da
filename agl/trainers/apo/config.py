"""``APOConfig``: every setting of prompt optimization, documented. Pure data (no I/O, no heavy imports)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agl.trainers.apo.prompts import CRITIQUE_PROMPT, EDIT_PROMPT

Mode = Literal["in_turn", "joint"]
Selection = Literal["pareto", "mean"]
Validation = Literal["select", "report", "off"]


@dataclass
class APOConfig:
    """Settings of ``APO``. Only ``prompts`` is required.

    What is optimized:
        prompts: names of the ``PromptTemplate`` resources to optimize (each owned by an agent through its ``agent``
            field). Their ``{placeholders}`` are kept: an edit that drops one, or adds one, is rejected.
        mode: ``"in_turn"`` (default) optimizes one prompt per iteration, round robin, the others held fixed:
            critiques stay focused and an improvement is attributable. ``"joint"`` edits every prompt in one
            optimizer call: useful when the prompts must change together (a writer and the checker of its format).
        optimizer_llm: name of the ``LLM`` resource used as the optimizer (default ``"optimizer_llm"``): any
            OpenAI-compatible endpoint, called directly by the algorithm, not through rollouts (its calls are not
            traced and cost no rollout).
        temperature: sampling temperature of the optimizer's calls. Default 0.7: edits should differ from one another.
        max_tokens: cap on each optimizer answer (None = the endpoint's default).
        untagged_edits: when one prompt is optimized and an edit reply holds no ``<prompt>`` block, take the whole
            reply (code fences stripped) as one version. For small optimizers that do not follow the markup; off by
            default, since a reply that is only prose then becomes a prompt to evaluate. Either way, a reply that
            yields no version is counted (``unparsed_replies`` in the metrics) and shown in ``apo_report.md``.

    Search:
        beam_width: candidates kept after each iteration. Default 4.
        branch_factor: edited prompts asked of the optimizer per parent candidate per iteration. Default 2.
        minibatch_size: training tasks each iteration evaluates on (sampled with ``seed``; all when larger than the
            task list). Default 8. Every candidate compared in an iteration ran on the same minibatch.
        rollout_budget: rollouts the search may spend on training tasks (validation is extra: finalists × val tasks).
            An iteration costs (beam + new candidates) × minibatch rollouts; the search stops when the next one does
            not fit with at least one new candidate, or early when an iteration over every training task yields no
            new candidate (nothing failed, or every edit was rejected or a duplicate). Default 200.
        selection: ``"pareto"`` (default) keeps every candidate that is best (ties allowed) on at least one task of
            the iteration's minibatch, then caps to ``beam_width`` by mean reward, giving precedence to candidates
            that are the best on a task no higher-ranked survivor wins; a prompt that is the only one to solve some
            tasks survives even with a low mean, so its fix can be combined later. ``"mean"`` keeps the top
            ``beam_width`` by mean reward (plain beam search).
        failure_threshold: a rollout whose final reward is below it counts as a failure and may be shown to the
            optimizer. Default 1.0.
        max_failures_shown: failed rollouts rendered into each critique (lowest rewards first). Default 4.
        max_chars_per_failure: each rendered failure is cut (in its middle) to this many characters. Default 3000.
        seed: seeds minibatch sampling and is passed to the optimizer endpoint. Default 0.

    Validation (with ``val_tasks``):
        validation: ``"select"`` (default) runs the final beam and the starting prompt on the validation tasks and
            publishes the best of them, so a prompt that overfits the minibatches is caught; ``"report"`` publishes
            the beam's best and only reports its validation score; ``"off"`` skips validation.

    Optimizer prompts:
        critique_prompt / edit_prompt: ``str.format`` templates of the two optimizer calls (defaults and their fields
            in ``agl.trainers.apo.prompts``).
    """

    prompts: Sequence[str]
    mode: Mode = "in_turn"
    optimizer_llm: str = "optimizer_llm"
    temperature: float = 0.7
    max_tokens: int | None = None
    untagged_edits: bool = False
    beam_width: int = 4
    branch_factor: int = 2
    minibatch_size: int = 8
    rollout_budget: int = 200
    selection: Selection = "pareto"
    failure_threshold: float = 1.0
    max_failures_shown: int = 4
    max_chars_per_failure: int = 3000
    seed: int = 0
    validation: Validation = "select"
    critique_prompt: str = CRITIQUE_PROMPT
    edit_prompt: str = EDIT_PROMPT

    def __post_init__(self) -> None:
        if isinstance(self.prompts, str):
            self.prompts = [self.prompts]
        self.prompts = list(self.prompts)
        if not self.prompts:
            raise ValueError("prompts: name at least one PromptTemplate resource to optimize")
        if len(set(self.prompts)) != len(self.prompts):
            raise ValueError(f"prompts: names must be distinct, got {self.prompts}")
        if self.optimizer_llm in self.prompts:
            raise ValueError(f"optimizer_llm: {self.optimizer_llm!r} is also listed in prompts")
        for name in ("beam_width", "branch_factor", "minibatch_size", "rollout_budget", "max_failures_shown"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_chars_per_failure < 200:
            raise ValueError(f"max_chars_per_failure: must be >= 200, got {self.max_chars_per_failure}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 or None, got {self.max_tokens}")
        choices: dict[str, tuple[str, ...]] = {
            "mode": ("in_turn", "joint"),
            "selection": ("pareto", "mean"),
            "validation": ("select", "report", "off"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
