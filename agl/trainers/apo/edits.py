"""Edited prompts out of the optimizer's reply, and the checks an edit must pass before it is evaluated. Pure.

Parsing is tolerant of what LLMs do around the markup (prose before and after, code fences inside the tags, quotes
or none around ``name``, upper-case tags) but never guesses: text outside a closed ``<prompt>...</prompt>`` pair is
ignored, so a reply cut off by a token limit cannot yield a truncated prompt.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from agl.core.types import PromptTemplate

_CANDIDATE = re.compile(r"<candidate\s*>(.*?)</candidate\s*>", re.S | re.I)
_PROMPT = re.compile(r"<prompt(?:\s+name\s*=\s*[\"']?([^\"'>\s]+)[\"']?)?\s*>(.*?)</prompt\s*>", re.S | re.I)
_TAG = re.compile(r"</?(?:prompt|candidate)\b", re.I)
_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.S)


def _clean(text: str) -> str:
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def _named(block: str, targets: Sequence[str]) -> dict[str, str]:
    """The target prompts written in one block (first occurrence of each name; unnamed = the only target)."""
    edit: dict[str, str] = {}
    for name, text in _PROMPT.findall(block):
        key = name or (targets[0] if len(targets) == 1 else "")
        if key in targets and key not in edit:
            edit[key] = _clean(text)
    return edit


def parse_edits(reply: str, targets: Sequence[str], untagged: bool = False) -> list[dict[str, str]]:
    """The versions in an edit reply, each a dict target name → new text (a target left out keeps its text).

    With ``<candidate>`` blocks, each block is one version. Without them, each ``<prompt>`` block is one version when
    a single prompt is optimized, and all named blocks together form one version when several are. ``untagged``
    (single target only): a reply with no ``<prompt>`` or ``<candidate>`` tag at all is one version, taken whole.
    """
    if untagged and len(targets) == 1 and not _TAG.search(reply) and _clean(reply):
        return [{targets[0]: _clean(reply)}]
    candidates = _CANDIDATE.findall(reply)
    if candidates:
        edits = [_named(block, targets) for block in candidates]
    elif len(targets) == 1:
        edits = [_named(match.group(0), targets) for match in _PROMPT.finditer(reply)]
    else:
        edits = [_named(reply, targets)]
    return [e for e in edits if e]


def check_edit(original: PromptTemplate, text: str) -> str | None:
    """Why ``text`` cannot replace ``original`` (None = it can): empty, not a valid ``str.format`` template, or its
    ``{placeholders}`` differ from the original's (a dropped one loses the run-time input, an added one would raise
    ``KeyError`` in the agent's ``format`` call)."""
    if not text.strip():
        return "empty prompt"
    try:
        list(string.Formatter().parse(text))
    except ValueError as exc:
        return f"not a valid str.format template ({exc}); literal braces must be doubled"
    new = PromptTemplate(template=text).placeholders
    dropped = sorted(original.placeholders - new)
    added = sorted(new - original.placeholders)
    if dropped:
        return "drops placeholder(s) " + ", ".join("{" + p + "}" for p in dropped)
    if added:
        return "adds unknown placeholder(s) " + ", ".join("{" + p + "}" for p in added)
    return None
