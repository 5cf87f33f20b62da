"""APO: automatic prompt optimization (textual gradients from failed rollouts, beam search, Pareto selection).

Names load lazily; nothing here imports torch, and ``openai`` is imported only when the optimizer is first called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agl._lazy import lazy_exports

if TYPE_CHECKING:
    from agl.trainers.apo.apo import APO, OfflineProposal
    from agl.trainers.apo.config import APOConfig
    from agl.trainers.apo.edits import check_edit, parse_edits
    from agl.trainers.apo.history import Candidate
    from agl.trainers.apo.prompts import CRITIQUE_PROMPT, EDIT_PROMPT
    from agl.trainers.apo.selection import pareto_front, pareto_select, top_k_by_mean

_EXPORTS = {
    "APO": "agl.trainers.apo.apo",
    "APOConfig": "agl.trainers.apo.config",
    "OfflineProposal": "agl.trainers.apo.apo",
    "Candidate": "agl.trainers.apo.history",
    "CRITIQUE_PROMPT": "agl.trainers.apo.prompts",
    "EDIT_PROMPT": "agl.trainers.apo.prompts",
    "check_edit": "agl.trainers.apo.edits",
    "parse_edits": "agl.trainers.apo.edits",
    "pareto_front": "agl.trainers.apo.selection",
    "pareto_select": "agl.trainers.apo.selection",
    "top_k_by_mean": "agl.trainers.apo.selection",
}

__all__ = [
    "APO",
    "CRITIQUE_PROMPT",
    "EDIT_PROMPT",
    "APOConfig",
    "Candidate",
    "OfflineProposal",
    "check_edit",
    "pareto_front",
    "pareto_select",
    "parse_edits",
    "top_k_by_mean",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
