"""From trajectories to SFT samples: which rollouts are kept (selection rules), and each kept LLM call laid out as
one token sequence with a loss mask. Pure functions, no torch.

Token ids are used exactly as recorded: ``input_ids = prompt_ids + response_ids`` and ``completion_mask`` is 1 on the
response tokens only; text is never re-tokenized, so training sees what the model saw and produced (a re-tokenized
response can differ from the sampled ids, and the chat template's rendering of a prompt can differ from what the
server fed the model).

The one exception, TEXT-DERIVED samples: a call that carries no token ids (a trace recorded outside agl and imported
with ``agl.otel``) is rendered from its messages with the chat template of the tokenizer given to ``build_samples``
(``render_messages``), and the sample is marked ``text_derived``. That is supervised learning on text, which is
legitimate for SFT; RL, which needs the ids the policy sampled, never gets such samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agl.core.types import Trajectory, Transition


class ChatTokenizer(Protocol):
    """What text-derived samples need of a tokenizer (a transformers tokenizer with a chat template)."""

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...


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
    text_derived: bool = False  # rendered from messages with the chat template, not the ids the model produced

    @property
    def response_tokens(self) -> int:
        return sum(self.completion_mask)


def _token_ids(rendered: Any) -> list[int]:
    """``apply_chat_template(..., tokenize=True)`` answers a list of ids or (newer transformers) an encoding."""
    return [int(i) for i in (rendered if isinstance(rendered, list) else rendered["input_ids"])]


def render_messages(transition: Transition, tokenizer: ChatTokenizer) -> tuple[list[int], list[int]]:
    """TEXT-DERIVED (prompt ids, response ids) of a transition without token ids: the request messages rendered
    with the chat template and its generation prompt, and the tokens the response message adds to that rendering.

    ``ValueError`` when the transition has no messages, or when the template does not render the conversation as
    the prompt followed by the response (then the response tokens cannot be told apart for the loss mask).
    """
    if not transition.request_messages or not transition.response_message:
        raise ValueError(f"transition {transition.span_id} has neither token ids nor request and response messages")
    prompt = _token_ids(
        tokenizer.apply_chat_template(transition.request_messages, tokenize=True, add_generation_prompt=True)
    )
    full = _token_ids(
        tokenizer.apply_chat_template([*transition.request_messages, transition.response_message], tokenize=True)
    )
    if len(full) <= len(prompt) or full[: len(prompt)] != prompt:
        raise ValueError(
            f"transition {transition.span_id}: the tokenizer's chat template does not render the conversation as "
            "the prompt (with its generation prompt) followed by the response, so the response tokens are unknown"
        )
    return prompt, full[len(prompt) :]


def to_sft_sample(
    transition: Transition, max_length: int | None = None, tokenizer: ChatTokenizer | None = None
) -> SFTSample:
    """Lay out one transition. With ``max_length``, the prompt is cut from the left so the sequence fits; the
    response is cut (from its end) only when it alone leaves no room for one prompt token.

    A transition without token ids is refused, unless ``tokenizer`` is given: then it is rendered from its messages
    (``render_messages``) into a sample marked ``text_derived``."""
    prompt, response = list(transition.prompt_ids), list(transition.response_ids)
    text_derived = False
    if (not prompt or not response) and tokenizer is not None:
        prompt, response = render_messages(transition, tokenizer)
        text_derived = True
    if not prompt or not response:
        raise ValueError(
            f"transition {transition.span_id} has no token ids: serve the model through agl's gateway (or a backend "
            "that returns token ids) so SFT trains on exactly what was generated, or, for traces recorded outside "
            "agl, pass the model's tokenizer to render their messages (text-derived samples)"
        )
    truncated = False
    if max_length is not None and len(prompt) + len(response) > max_length:
        truncated = True
        response = response[: max_length - 1]
        prompt = prompt[len(prompt) - (max_length - len(response)) :]
    return SFTSample(prompt + response, [0] * len(prompt) + [1] * len(response), truncated, text_derived)


def build_samples(
    trajectories: Sequence[Trajectory], max_length: int | None = None, tokenizer: ChatTokenizer | None = None
) -> list[SFTSample]:
    """Every transition of ``trajectories`` as a sample, in order (``tokenizer``: see ``to_sft_sample``)."""
    return [to_sft_sample(t, max_length, tokenizer) for traj in trajectories for t in traj.transitions]
