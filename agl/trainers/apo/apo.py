"""APO: prompt optimization with textual gradients, a beam of candidates and Pareto selection over tasks.

One iteration: sample a minibatch of training tasks → run every beam candidate on it (a candidate runs as its own
resources version: the starting resources with its prompts swapped in) → for each parent with failures, the optimizer
LLM writes a critique from the failed rollouts, then ``branch_factor`` edited prompts → edits that break the
template's placeholders are rejected → the new candidates run on the same minibatch → survivors are selected over the
minibatch's tasks (Pareto, capped to the beam width). The search stops on the rollout budget; validation on held-out
tasks then picks the prompts published last. Every candidate is kept (store records, ``apo_history.json``,
``apo_report.md``).

One thread drives everything; rollouts run in the Trainer's runners, one candidate's batch at a time.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agl.core.algorithm import Algorithm
from agl.core.types import LLM, PromptTemplate, Record, Resource, Trajectory
from agl.trainers.apo.config import APOConfig
from agl.trainers.apo.edits import check_edit
from agl.trainers.apo.feedback import shorten
from agl.trainers.apo.history import Candidate, write_history
from agl.trainers.apo.selection import Scores, mean_score, pareto_select, top_k_by_mean

if TYPE_CHECKING:
    from agl.core.context import TrainContext
    from agl.trainers.apo.optimizer import OptimizerLLM

RECORD_KIND = "apo_candidate"

log = logging.getLogger("agl.trainers.apo")

Outcome = list[tuple[Trajectory, float]]


@dataclass
class OfflineProposal:
    """What ``APO.fit_offline`` found: the proposed prompts (name → text; ``prompts`` is the first of
    ``candidates``), the critique they came from, the edits refused and why, and how many rollouts it read."""

    prompts: dict[str, str]
    candidates: list[dict[str, str]]
    critique: str
    rejected: list[str]
    failures: int
    rollouts: int


class APO(Algorithm):
    """Optimizes the agent's ``PromptTemplate`` resources with an optimizer LLM; changes no weights.

    Example::

        resources = {
            "main_llm": agl.LLM(base_url=..., model="gpt-4.1-mini"),
            "optimizer_llm": agl.LLM(base_url=..., model="gpt-4.1"),
            "system_prompt": agl.PromptTemplate(template="Answer the question: {question}", agent="solver"),
        }
        cfg = APOConfig(prompts=["system_prompt"], beam_width=4, branch_factor=2, rollout_budget=300)
        result = agl.Trainer(algorithm=APO(cfg), resources=resources).fit(agent, train_tasks, val_tasks)
        print(result.resources.resources["system_prompt"].template)

    The agent reads its prompt from ``resources[name]`` on every rollout and returns its reward. Metrics per
    iteration go to ``ctx.log_metrics``; candidates to the store (record kind ``apo_candidate``, latest record of a
    key = its latest state), ``run_dir/apo_history.json`` and ``run_dir/apo_report.md``.
    """

    def __init__(self, config: APOConfig) -> None:
        self.config = config

    def fit(self, ctx: TrainContext, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        if not train_tasks:
            raise ValueError("APO.fit: no training tasks")
        return _Search(ctx, self.config, train_tasks).run(val_tasks)

    def fit_offline(self, resources: Mapping[str, Resource], trajectories: Sequence[Trajectory]) -> OfflineProposal:
        """One critique-and-edit step from rollouts already recorded (imported traces), without running the agent.

        ``resources`` hold the prompts to improve (``config.prompts``) and the optimizer LLM
        (``config.optimizer_llm``); ``trajectories`` come from ``agl.otel.stored_trajectories``. The rollouts whose
        final reward is below ``config.failure_threshold`` (or missing) are the failures the optimizer critiques; it
        is asked for ``config.branch_factor`` edited versions, and those that keep the templates' placeholders are
        returned, first one as ``prompts``. They are not scored: scoring needs the agent (``fit``).
        """
        from agl.trainers.apo.optimizer import OptimizerLLM

        cfg = self.config
        templates: dict[str, PromptTemplate] = {}
        for name in cfg.prompts:
            found = resources.get(name)
            if not isinstance(found, PromptTemplate):
                raise ValueError(f"APO.fit_offline: resources[{name!r}] must be a PromptTemplate, found {found!r}")
            templates[name] = found
        optimizer_llm = resources.get(cfg.optimizer_llm)
        if not isinstance(optimizer_llm, LLM):
            raise ValueError(f"APO.fit_offline: resources[{cfg.optimizer_llm!r}] must be an LLM (the optimizer)")
        if not trajectories:
            raise ValueError("APO.fit_offline: no trajectories to learn from")
        scored = [(t, t.final_reward if t.final_reward is not None else 0.0) for t in trajectories]
        failures = [(t, r) for t, r in scored if r < cfg.failure_threshold]
        if not failures:
            raise ValueError(
                f"APO.fit_offline: none of the {len(scored)} rollouts scored below failure_threshold "
                f"{cfg.failure_threshold}: there is no failure to learn from"
            )
        current = {name: t.template for name, t in templates.items()}
        mean = sum(r for _, r in scored) / len(scored)
        optimizer = OptimizerLLM(optimizer_llm, cfg)
        proposal = optimizer.propose(
            current, templates, list(cfg.prompts), failures, len(scored), mean, cfg.branch_factor
        )
        kept: list[dict[str, str]] = []
        rejected: list[str] = []
        for edit in proposal.edits:
            reasons = [f"{name}: {why}" for name in edit if (why := check_edit(templates[name], edit[name]))]
            if reasons:
                rejected.append("; ".join(reasons))
            elif {**current, **edit} != current:
                kept.append({**current, **edit})
        if not kept:
            raise ValueError(
                "APO.fit_offline: the optimizer proposed no usable prompt"
                + (
                    f" (rejected: {'; '.join(rejected)})"
                    if rejected
                    else f"; its reply starts {proposal.reply[:200]!r}"
                )
            )
        return OfflineProposal(kept[0], kept, proposal.critique, rejected, len(failures), len(scored))


def task_keys(tasks: Sequence[Any]) -> list[str]:
    """A distinct key per task: its id (see ``task_id_of``), suffixed with its position when ids repeat."""
    from agl.core.context import task_id_of

    keys: list[str] = []
    for i, task in enumerate(tasks):
        key = task_id_of(task)
        keys.append(f"{key}#{i}" if key in keys else key)
    return keys


class _Search:
    """The state of one ``APO.fit`` call: candidates, beam, rollouts spent."""

    def __init__(self, ctx: TrainContext, config: APOConfig, train_tasks: Sequence[Any]) -> None:
        from agl.core.store.base import NotFound
        from agl.trainers.apo.optimizer import OptimizerLLM

        self.ctx, self.cfg = ctx, config
        self.tasks = list(train_tasks)
        self.keys = task_keys(self.tasks)
        try:
            self.base: dict[str, Resource] = dict(ctx.latest_resources().resources)
        except NotFound as exc:
            raise ValueError("APO needs published resources: pass them with Trainer(resources=...)") from exc
        self.templates = {name: self._resource(name, PromptTemplate) for name in config.prompts}
        self.optimizer: OptimizerLLM = OptimizerLLM(self._resource(config.optimizer_llm, LLM), config)
        self.rng = random.Random(config.seed)
        self.candidates: list[Candidate] = []
        self.seen: set[tuple[tuple[str, str], ...]] = set()
        self.rollouts = 0
        self.val_rollouts = 0
        self.iterations = 0
        self.unparsed = 0
        self.last_unparsed: str | None = None
        self.stop_reason: str | None = None

    def _resource(self, name: str, kind: type[Any]) -> Any:
        resource = self.base.get(name)
        if not isinstance(resource, kind):
            found = "nothing" if resource is None else type(resource).__name__
            raise ValueError(
                f"APO: resource {name!r} must be a {kind.__name__}, found {found}; "
                f"published resources: {sorted(self.base)}"
            )
        return resource

    # -- the loop ----------------------------------------------------------------------------------------------------

    def run(self, val_tasks: Sequence[Any] | None) -> dict[str, Any]:
        start = self._new(None, 0, {name: t.template for name, t in self.templates.items()}, None)
        beam = [start]
        while self.stop_reason is None:
            beam = self._iteration(beam)
            self._write()
        chosen = self._validate(beam, start, list(val_tasks or []))
        published = self.ctx.publish(self._resources(chosen.prompts))
        metrics: dict[str, Any] = {
            "chosen": chosen.id,
            "published_version": published.version,
            "iterations": self.iterations,
            "rollouts": self.rollouts,
            "val_rollouts": self.val_rollouts,
            "candidates": sum(c.status == "evaluated" for c in self.candidates),
            "rejected": sum(c.status == "rejected" for c in self.candidates),
            "optimizer_calls": self.optimizer.calls,
            "unparsed_replies": self.unparsed,
            "stop_reason": self.stop_reason,
            "train/mean_reward": chosen.mean,
            "val/mean_reward": chosen.val_mean,
            "val/start_mean_reward": start.val_mean,
        }
        self.ctx.log_metrics(self.iterations, {k: v for k, v in metrics.items() if v is not None})
        self._write(chosen=chosen.id, published_version=published.version)
        return metrics

    def _iteration(self, beam: list[Candidate]) -> list[Candidate]:
        """Evaluate the beam on a fresh minibatch, expand it, evaluate the children, select. Sets ``stop_reason``."""
        cfg = self.cfg
        batch = self._minibatch()
        room = (cfg.rollout_budget - self.rollouts) // len(batch) - len(beam)
        if room < 1:
            self.stop_reason = "rollout budget"
            return beam
        self.iterations += 1
        number = self.iterations
        targets = list(cfg.prompts) if cfg.mode == "joint" else [cfg.prompts[(number - 1) % len(cfg.prompts)]]
        tasks = [self.tasks[i] for i in batch]
        keys = [self.keys[i] for i in batch]
        outcomes = {c.id: self._evaluate(c, tasks, keys, "train") for c in beam}
        children: list[Candidate] = []
        rejected = 0
        for parent in beam:
            if len(children) >= room:
                break
            new, bad = self._expand(parent, outcomes[parent.id], targets, min(cfg.branch_factor, room - len(children)))
            children += new
            rejected += bad
        for child in children:
            outcomes[child.id] = self._evaluate(child, tasks, keys, "train")
        pool = beam + children
        scores: Scores = {c.id: {k: r for k, (_, r) in zip(keys, outcomes[c.id], strict=True)} for c in pool}
        select: Callable[[Scores, Sequence[str], int], list[str]] = (
            pareto_select if cfg.selection == "pareto" else top_k_by_mean
        )
        kept = select(scores, keys, cfg.beam_width)
        by_id = {c.id: c for c in pool}
        new_beam = [by_id[cid] for cid in kept]
        for c in new_beam:
            c.survived.append(number)
        for c in pool:
            self._record(c)
        self.ctx.log_metrics(
            number,
            {
                "iteration": number,
                "targets": ",".join(targets),
                "rollouts": self.rollouts,
                "minibatch": len(batch),
                "new_candidates": len(children),
                "rejected": rejected,
                "unparsed_replies": self.unparsed,
                "beam": ",".join(kept),
                "best_mean": mean_score(scores[kept[0]], keys),
                "beam_mean": sum(mean_score(scores[cid], keys) for cid in kept) / len(kept),
            },
        )
        if not children and len(batch) == len(self.tasks):
            self.stop_reason = "no new candidate"
        return new_beam

    def _expand(self, parent: Candidate, outcome: Outcome, targets: list[str], n: int) -> tuple[list[Candidate], int]:
        """Ask the optimizer for ``n`` edits of ``parent`` from its failures; returns (new candidates, rejected)."""
        failures = [(traj, r) for traj, r in outcome if r < self.cfg.failure_threshold]
        if not failures:
            return [], 0
        mean = sum(r for _, r in outcome) / len(outcome)
        proposal = self.optimizer.propose(parent.prompts, self.templates, targets, failures, len(outcome), mean, n)
        if not proposal.edits:
            self.unparsed += 1
            self.last_unparsed = shorten(proposal.reply, 1500)
            log.warning(
                "APO: the optimizer's edit reply for %s held no usable version (markup: see APOConfig.untagged_edits); "
                "it starts %r",
                parent.id,
                proposal.reply[:200],
            )
        children: list[Candidate] = []
        rejected = 0
        for edit in proposal.edits:
            prompts = {**parent.prompts, **edit}
            if _key(prompts) in self.seen:
                continue
            child = self._new(parent.id, self.iterations, prompts, proposal.critique)
            reasons = [f"{name}: {why}" for name in edit if (why := check_edit(self.templates[name], edit[name]))]
            if reasons:
                child.status, child.reason = "rejected", "; ".join(reasons)
                self._record(child)
                rejected += 1
            else:
                children.append(child)
        return children, rejected

    def _validate(self, beam: list[Candidate], start: Candidate, val_tasks: list[Any]) -> Candidate:
        """The candidate to publish: the best on validation among the beam and the start (``select``), else the
        beam's best (whose validation score ``report`` measures)."""
        mode = self.cfg.validation
        if not val_tasks or mode == "off":
            return beam[0]
        group = beam[:1] if mode == "report" else [*beam, *([] if start in beam else [start])]
        keys = task_keys(val_tasks)
        for c in group:
            self._evaluate(c, val_tasks, keys, "val")
            self._record(c)
        return max(group, key=lambda c: (c.val_mean or 0.0, -group.index(c)))

    # -- pieces ------------------------------------------------------------------------------------------------------

    def _minibatch(self) -> list[int]:
        n, k = len(self.tasks), self.cfg.minibatch_size
        return list(range(n)) if k >= n else sorted(self.rng.sample(range(n), k))

    def _new(self, parent: str | None, iteration: int, prompts: dict[str, str], critique: str | None) -> Candidate:
        candidate = Candidate(f"c{len(self.candidates)}", parent, iteration, dict(prompts), critique)
        self.candidates.append(candidate)
        self.seen.add(_key(prompts))
        return candidate

    def _resources(self, prompts: dict[str, str]) -> dict[str, Resource]:
        """The starting resources with ``prompts`` swapped in (each keeps its owner agent)."""
        out = dict(self.base)
        for name, text in prompts.items():
            out[name] = PromptTemplate(template=text, agent=self.templates[name].agent)
        return out

    def _evaluate(self, c: Candidate, tasks: list[Any], keys: list[str], mode: str) -> Outcome:
        """Run ``c`` once on each task (published as its own version the first time); rewards are added to it."""
        if c.resources_version is None:
            c.resources_version = self.ctx.publish(self._resources(c.prompts)).version
        batch = self.ctx.rollouts(
            tasks,
            mode="val" if mode == "val" else "train",
            resources_version=c.resources_version,
            desc=f"apo {mode} {c.id}",
        )
        outcome = list(zip(batch.trajectories, batch.rewards, strict=True))
        target = c.val_rewards if mode == "val" else c.rewards
        for key, (_, reward) in zip(keys, outcome, strict=True):
            target.setdefault(key, []).append(reward)
        if mode == "val":
            self.val_rollouts += len(tasks)
        else:
            self.rollouts += len(tasks)
        return outcome

    def _record(self, c: Candidate) -> None:
        self.ctx.store.add_record(Record(kind=RECORD_KIND, key=c.id, data=c.to_dict()))

    def _write(self, **extra: Any) -> None:
        summary = {
            "iterations": self.iterations,
            "rollouts": self.rollouts,
            "val_rollouts": self.val_rollouts,
            "rollout_budget": self.cfg.rollout_budget,
            "selection": self.cfg.selection,
            "beam_width": self.cfg.beam_width,
            "mode": self.cfg.mode,
            "stop_reason": self.stop_reason,
            "unparsed_replies": self.unparsed,
            "last_unparsed_reply": self.last_unparsed,
            **extra,
        }
        write_history(self.ctx.run_dir, self.candidates, summary)


def _key(prompts: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(prompts.items()))
