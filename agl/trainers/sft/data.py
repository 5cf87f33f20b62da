"""From trajectories to SFT samples: which rollouts are kept (selection rules), and each kept LLM call laid out as
one token sequence with a loss mask. Pure functions, no torch.

Token ids are used exactly as recorded: ``input_ids = prompt_ids + response_ids`` and ``completion_mask`` is 1 on the
response tokens only; text is never re-tokenized, so training sees what the model saw and produced (a re-tokenized
response can differ from the sampled ids, and the chat template's rendering of a prompt can differ from what the
server fed the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agl.core.types import Trajectory, Transition


def select_trajectories(
    trajectories: Sequence[Trajectory],
    *,
    successful_only: bool = True,
    min_reward: float | None = None,
    top_k_per_task: int | None = None,
) -> list[Trajectory]:
    """The trajectories worth imitating, in their original order (rules documented on ``SFTConfig``)."""
    kept = [
        t
        for t in trajectories
        if (not successful_only or (t.status == "succeeded" and t.final_reward is not None))
        and (min_reward is None or (t.final_reward is not None and t.final_reward >= min_reward))
    ]
    if top_k_per_task is None:
        return kept
    by_task: dict[str, list[int]] = {}
    for i, t in enumerate(kept):
        by_task.setdefault(t.task_id or t.rollout_id, []).append(i)
    chosen: set[int] = set()
    for indices in by_task.values():
        ranked = sorted(indices, key=lambda i: (-(kept[i].final_reward or 0.0), i))
        chosen.update(ranked[:top_k_per_task])
    return [t for i, t in enumerate(kept) if i in chosen]


@dataclass(frozen=True)
class SFTSample:
    """One LLM call as a training sequence: ``completion_mask[j] == 1`` when ``input_ids[j]`` is a response token."""

    input_ids: list[int]
    completion_mask: list[int]
    truncated: bool = False

    @property
    def response_tokens(self) -> int:
        return sum(self.completion_mask)


def to_sft_sample(transition: Transition, max_length: int | None = None) -> SFTSample:
    """Lay out one transition. With ``max_length``, the prompt is cut from the left so the sequence fits; the
    response is cut (from its end) only when it alone leaves no room for one prompt token."""
    prompt, response = list(transition.prompt_ids), list(transition.response_ids)
    if not prompt or not response:
        raise ValueError(
            f"transition {transition.span_id} has no token ids: serve the model through agl's gateway (or a backend "
            "that returns token ids) so SFT trains on exactly what was generated"
        )
    truncated = False
    if max_length is not None and len(prompt) + len(response) > max_length:
        truncated = True
        response = response[: max_length - 1]
        prompt = prompt[len(prompt) - (max_length - len(response)) :]
    return SFTSample(prompt + response, [0] * len(prompt) + [1] * len(response), truncated)


def build_samples(trajectories: Sequence[Trajectory], max_length: int | None = None) -> list[SFTSample]:
    """Every transition of ``trajectories`` as a sample, in order."""
    return [to_sft_sample(t, max_length) for traj in trajectories for t in traj.transitions]
