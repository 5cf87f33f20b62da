"""Several policies in one run: one LoRA adapter per listed agent over one shared base model.

The gateway sends each routed agent's calls to its own served model (``LLM.routes``; the adapter of agent ``a`` is
served as ``f"{model_name}/{a}"``, see ``adapter_model``) and ``Transition.policy`` records where each call went. This
module owns the training side: the ``policies`` setting (``validate_policies``), a round's trajectories split by
policy (``split_by_policy``), and ``AdapterSet``: one ``PolicyUpdater`` per agent, each with its own copy of the base
model, its own LoRA adapter and its own AdamW, so an agent's transitions can only ever change its own adapter; plus
their checkpoints (a peft folder per adapter and a ``manifest.json`` of agent → folder → version). The pure functions
need no torch. One thread (the algorithm's) drives it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from agl.core.types import PolicyRoute, Trajectory, Transition

if TYPE_CHECKING:
    from agl.trainers.rl.update import PolicyUpdater
    from agl.trainers.rl.update_config import UpdateConfig

#: What a listed agent's policy can be: only its own LoRA adapter over the shared base model, for now.
POLICY_KINDS: tuple[str, ...] = ("lora",)
MANIFEST = "manifest.json"


class AdapterServing(Protocol):
    """A serving backend that serves named LoRA adapters next to its base model (``LocalBackend``, ``VllmBackend``)."""

    def sync_adapter(self, name: str, folder: Path, version: str) -> str:
        """Serve the peft adapter in ``folder`` as agent ``name``'s adapter at ``version`` from now on; the base model
        and the other adapters stay as they are. Returns the model name requests for that version must carry."""


def validate_policies(policies: Mapping[str, str], field: str = "policies") -> None:
    """Raise a ``ValueError`` naming ``field`` unless ``policies`` maps non-empty agent names to a kind of
    ``POLICY_KINDS``."""
    if not isinstance(policies, Mapping):
        raise ValueError(f"{field}: expected a mapping of agent name → 'lora', got {type(policies).__name__}")
    for agent, kind in policies.items():
        if not isinstance(agent, str) or not agent.strip():
            raise ValueError(f"{field}: agent names must be non-empty strings, got {agent!r}")
        if kind not in POLICY_KINDS:
            raise ValueError(
                f"{field}[{agent!r}]: only 'lora' (a LoRA adapter of its own over the base model) is supported, "
                f"got {kind!r}"
            )


def adapter_model(model_name: str, agent: str) -> str:
    """The model name an agent's adapter is served under: ``policy`` + ``writer`` → ``policy/writer``."""
    return f"{model_name}/{agent}"


def split_by_policy(
    trajectories: Sequence[Trajectory], models: Mapping[str, str]
) -> dict[str | None, list[Trajectory]]:
    """The trajectories of each policy: for every agent of ``models`` (served model name → agent), each trajectory
    restricted to the transitions whose ``policy`` is that agent's model; under ``None``, the transitions that went
    to any other model or recorded none (the base model's, not trained when policies are set).

    The restricted trajectories share the original ``Transition`` objects, so advantages computed on them land on
    the originals. Trajectories without a transition of a policy are left out of that policy's list.
    """
    out: dict[str | None, list[Trajectory]] = {agent: [] for agent in models.values()}
    out[None] = []
    for trajectory in trajectories:
        mine: dict[str | None, list[Transition]] = {}
        for transition in trajectory.transitions:
            agent = models.get(transition.policy) if transition.policy is not None else None
            mine.setdefault(agent, []).append(transition)
        for agent, transitions in mine.items():
            out[agent].append(trajectory.model_copy(update={"transitions": transitions}))
    return out


def count_transitions(trajectories: Sequence[Trajectory]) -> int:
    """All transitions of ``trajectories``."""
    return sum(len(t.transitions) for t in trajectories)


def adapter_folder(agent: str) -> str:
    """The folder name of an agent's adapter in a checkpoint (percent-encoded: agent names may hold ``/``)."""
    return quote(agent, safe="")


def write_manifest(folder: Path, base_model: str | Path, versions: Mapping[str, str], model_name: str) -> Path:
    """Write ``folder/manifest.json``: the base model and, per agent, its adapter folder (``adapter_folder``), the
    version it is served at and the served model name. Written atomically, after the adapters themselves."""
    adapters = {
        agent: {"folder": adapter_folder(agent), "version": version, "model": adapter_model(model_name, agent)}
        for agent, version in versions.items()
    }
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"base_model": str(base_model), "adapters": adapters}, indent=1), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return folder / MANIFEST


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest ``AdapterSet.save`` wrote into ``folder``."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no per-agent adapters ({MANIFEST} missing)")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


class AdapterSet:
    """One trainable LoRA adapter per agent, each on its own copy of the base model with its own optimizer.

    Example::

        adapters = AdapterSet(model_dir, ["writer", "rewriter"], UpdateConfig(lr=1e-4), model_name="policy")
        adapters.updaters["writer"].step(writer_transitions)     # only the writer's adapter moves
        adapters.versions["writer"] = "v1"
        adapters.save(folder)                                    # folder/writer, folder/rewriter, folder/manifest.json

    Separate copies cost one base model of memory per agent on the training side; in exchange the adapters share
    no parameter, gradient or optimizer state, so one agent's update cannot touch another's adapter.
    """

    def __init__(self, model_dir: str | Path, agents: Sequence[str], config: UpdateConfig, model_name: str) -> None:
        from agl.trainers.rl.update import PolicyUpdater

        if not agents:
            raise ValueError("AdapterSet: no agents")
        self.model_dir = Path(model_dir)
        self.model_name = model_name
        adapter_config = replace(config, lora=True)
        self.updaters: dict[str, PolicyUpdater] = {a: PolicyUpdater(model_dir, adapter_config) for a in agents}
        #: The weights version each adapter is served at; it changes only when that adapter is updated.
        self.versions: dict[str, str] = dict.fromkeys(agents, "v0")
        #: The model name that reaches each adapter's current version, as the backend said at the last ``sync``.
        self.served: dict[str, str] = {agent: adapter_model(model_name, agent) for agent in agents}

    def models(self) -> dict[str, str]:
        """Served model name → agent."""
        return {self.served[agent]: agent for agent in self.updaters}

    def routes(self) -> dict[str, PolicyRoute]:
        """The ``LLM.routes`` that send each agent to its adapter at its current version."""
        return {
            agent: PolicyRoute(model=self.served[agent], weights_version=self.versions[agent])
            for agent in self.updaters
        }

    def save(self, folder: Path) -> Path:
        """Write every adapter (peft format, with the tokenizer) into ``folder/<agent>`` and then the manifest."""
        folder.mkdir(parents=True, exist_ok=True)
        for agent, updater in self.updaters.items():
            updater.save(folder / adapter_folder(agent))
        write_manifest(folder, self.model_dir, self.versions, self.model_name)
        return folder

    def load(self, folder: Path) -> None:
        """Restore every adapter and its version from what ``save`` wrote; each agent must be in the manifest."""
        adapters = read_manifest(folder).get("adapters", {})
        missing = sorted(set(self.updaters) - set(adapters))
        if missing:
            raise ValueError(f"{folder / MANIFEST}: no adapter for the agents {missing} listed in policies")
        for agent, updater in self.updaters.items():
            updater.load(folder / adapters[agent]["folder"])
            self.versions[agent] = str(adapters[agent]["version"])

    def sync(self, backend: AdapterServing, folder: Path, agents: Sequence[str] | None = None) -> None:
        """Serve the adapters saved in ``folder`` (``agents``, default all) at their versions; called before the
        publish that routes to them, so a route never names a version the server does not have."""
        for agent in self.updaters if agents is None else agents:
            self.served[agent] = backend.sync_adapter(agent, folder / adapter_folder(agent), self.versions[agent])

    def optimizer_states(self) -> dict[str, Any]:
        """Each adapter's optimizer state, by agent (for checkpoints)."""
        return {agent: updater.optimizer_state() for agent, updater in self.updaters.items()}

    def load_optimizer_states(self, states: Mapping[str, Any]) -> None:
        """Restore what ``optimizer_states`` returned."""
        for agent, updater in self.updaters.items():
            if agent not in states:
                raise ValueError(f"checkpoint: no optimizer state for the adapter of {agent!r}")
            updater.load_optimizer_state(states[agent])
