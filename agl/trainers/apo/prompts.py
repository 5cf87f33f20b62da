"""The optimizer LLM's two prompts: the critique ("textual gradient") and the edit request. Pure strings.

Both are ``str.format`` templates; override them through ``APOConfig.critique_prompt`` / ``APOConfig.edit_prompt``.
Literal braces in an override must be doubled (``{{`` / ``}}``). The fields each template receives:

``CRITIQUE_PROMPT``
    ``{prompts}``: the candidate's prompts, each as ``<prompt name="...">text</prompt>``;
    ``{targets}``: the names of the prompts being optimized in this step (comma separated);
    ``{failures}``: the rendered failed rollouts (task, LLM calls with their messages and tool results, error, reward);
    ``{n_failures}`` / ``{n_rollouts}``: how many rollouts of the minibatch failed / ran;
    ``{mean_reward}``: the candidate's mean reward on the minibatch (two decimals).

``EDIT_PROMPT``
    ``{prompts}``, ``{targets}``, ``{failures}``: as above;
    ``{critique}``: the optimizer's answer to the critique prompt;
    ``{n}``: how many new versions to write;
    ``{placeholders}``: a sentence listing the ``{placeholders}`` each target must keep (empty when none);
    ``{output_format}``: how to mark up the answer so it can be parsed (``format_instructions``).

The edit answer is parsed by ``agl.trainers.apo.edits.parse_edits``: versions between ``<prompt name="...">`` and
``</prompt>`` (one prompt optimized), or ``<candidate>`` blocks of named prompts (several prompts at once). An override
of ``EDIT_PROMPT`` should keep ``{output_format}`` (or spell out the same markup) so the reply stays parseable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CRITIQUE_PROMPT = """\
You are improving the prompts of an LLM agent. The agent ran a batch of tasks with the prompts below; \
{n_failures} of {n_rollouts} rollouts failed (mean reward {mean_reward}).

Current prompts:
{prompts}

Failed rollouts (the task, every LLM call the agent made with its messages and tool results, the error if any, \
and the reward):
{failures}

Study the failures and explain, as concrete points, what in the prompt(s) {targets} leads the agent to fail: \
missing instructions, ambiguities, wrong emphasis, missing output format. Do not rewrite the prompt yet; \
write the critique only."""

EDIT_PROMPT = """\
You are improving the prompts of an LLM agent.

Current prompts:
{prompts}

Failed rollouts:
{failures}

Critique of the current prompt(s):
{critique}

Write {n} improved version(s) of the prompt(s) {targets} that fix the problems named in the critique. \
Each version should be a complete prompt that can replace the current one, not a diff. Versions should differ \
from each other so they explore different fixes. {placeholders}

{output_format}"""


def render_prompts(prompts: Mapping[str, str]) -> str:
    """The prompts as ``<prompt name="...">`` blocks, in the markup the edit reply uses."""
    return "\n".join(f'<prompt name="{name}">\n{text}\n</prompt>' for name, text in prompts.items())


def placeholder_note(placeholders: Mapping[str, set[str]]) -> str:
    """One sentence telling the optimizer which ``{placeholders}`` each target must keep verbatim."""
    parts = [
        f"{name}: {', '.join('{' + p + '}' for p in sorted(names))}" for name, names in placeholders.items() if names
    ]
    if not parts:
        return ""
    return (
        "Keep every placeholder of the current prompt exactly as written (they are filled in at run time) and add no "
        "new ones: " + "; ".join(parts) + "."
    )


def format_instructions(targets: Sequence[str], n: int) -> str:
    """How the optimizer must mark up its versions: one ``<prompt>`` block per version for a single target, one
    ``<candidate>`` block (holding every target) per version for several."""
    if len(targets) == 1:
        name = targets[0]
        return (
            f'Answer with exactly {n} version(s), each between <prompt name="{name}"> and </prompt>, '
            "with nothing else inside the tags."
        )
    blocks = "\n".join(f'<prompt name="{name}">...</prompt>' for name in targets)
    return (
        f"Answer with exactly {n} version(s), each between <candidate> and </candidate>, holding every prompt:\n"
        f"<candidate>\n{blocks}\n</candidate>"
    )
