"""The policies one LightningRL run trains: one policy, or one LoRA adapter per listed agent over a shared base model.

The gateway sends each routed agent's calls to its own served model (``LLM.routes``; the adapter of agent ``a`` is
served as ``f"{model_name}/{a}"``, see ``adapter_model``) and ``Transition.policy`` records where each call went. This
module owns the training side: the ``policies`` setting (``validate_policies``), a round's trajectories split by
policy (``split_by_policy``), and ``PolicySet``: the policies as one shape, a single policy being a set of one member,
so the RL loop has one path for both; plus their checkpoints (``policy`` in a round folder, or a peft folder per
adapter and a ``manifest.json`` of agent → folder → version under ``policies``). The pure functions need no torch.
One thread (the algorithm's) drives it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import quote

from agl.core.types import PolicyRoute, Trajectory, Transition
from agl.trainers._weights import BASE_VERSION, adapter_model

if TYPE_CHECKING:
    from agl.trainers.rl.backend import PolicyBackend
    from agl.trainers.rl.update import PolicyUpdater
    from agl.trainers.rl.update_config import UpdateConfig

#: What a listed agent's policy can be: only its own LoRA adapter over the shared base model, for now.
POLICY_KINDS: tuple[str, ...] = ("lora",)
MANIFEST = "manifest.json"
#: A round folder's weights: one policy (``PolicyUpdater.save``), or per-agent adapters and their manifest.
POLICY_DIR = "policy"
POLICIES_DIR = "policies"


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


class PolicySet:
    """The policies a LightningRL run trains, as one shape: one member (key ``None``, the policy every agent's calls
    reach; full weights or a LoRA adapter) or one LoRA adapter per listed agent, each member with its own
    ``PolicyUpdater`` (its own copy of the base model and its own AdamW, so an agent's transitions can only ever change
    its own adapter), its version and the model name the backend serves it under.

    Example::

        policies = PolicySet(model_dir, ["writer", "rewriter"], UpdateConfig(lr=1e-4), model_name="policy")
        policies.updaters["writer"].step(writer_transitions)   # only the writer's adapter moves
        policies.versions["writer"] = "v1"
        policies.save(round_folder)                            # round_folder/policies/{writer,rewriter,manifest.json}

    Separate copies cost one base model of memory per agent on the training side.
    """

    def __init__(
        self,
        model_dir: str | Path,
        agents: Sequence[str],
        config: UpdateConfig,
        model_name: str,
        default_temperature: float = 1.0,
    ) -> None:
        from agl.trainers.config import LoraConfig
        from agl.trainers.rl.update import PolicyUpdater

        self.model_dir = Path(model_dir)
        self.model_name = model_name
        self.per_agent = bool(agents)
        member_config = replace(config, lora=config.lora or LoraConfig()) if agents else config
        members: list[str | None] = list(agents) if agents else [None]
        self.updaters: dict[str | None, PolicyUpdater] = {
            m: PolicyUpdater(model_dir, member_config, default_temperature, name=m) for m in members
        }
        #: The weights version each member is served at; it changes only when that member is updated.
        self.versions: dict[str | None, str] = dict.fromkeys(members, BASE_VERSION)
        #: The model name that reaches each agent's adapter at its current version, as the backend said at ``sync``.
        self.served: dict[str, str] = {agent: adapter_model(model_name, agent) for agent in agents}

    @property
    def folder_name(self) -> str:
        """Where a round folder holds the weights: ``policy`` (one member) or ``policies`` (adapters + manifest)."""
        return POLICIES_DIR if self.per_agent else POLICY_DIR

    def models(self) -> dict[str, str]:
        """Served model name → agent (per-agent adapters; empty for one member)."""
        return {name: agent for agent, name in self.served.items()}

    def routes(self) -> dict[str, PolicyRoute]:
        """The ``LLM.routes`` that send each agent to its adapter at its current version (none for one member)."""
        return {
            agent: PolicyRoute(model=name, weights_version=self.versions[agent]) for agent, name in self.served.items()
        }

    def split(self, trajectories: Sequence[Trajectory]) -> dict[str | None, list[Trajectory]]:
        """The trajectories each member trains on (``split_by_policy``); with one member, all of them under ``None``."""
        if not self.per_agent:
            return {None: list(trajectories)}
        return split_by_policy(trajectories, self.models())

    def expected_versions(self) -> dict[str | None, str]:
        """The version each part of ``split`` must have been served at: each member's own, and for calls outside
        the per-agent adapters the untrained base model's."""
        return {None: BASE_VERSION, **self.versions}

    def save(self, round_folder: Path) -> Path:
        """Write every member into ``round_folder/folder_name`` (peft or ``save_pretrained`` format, with the
        tokenizer; per-agent adapters as ``<agent>`` folders, then the manifest). Returns that folder."""
        folder = round_folder / self.folder_name
        if not self.per_agent:
            return self.updaters[None].save(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for agent, updater in self.updaters.items():
            updater.save(folder / adapter_folder(str(agent)))
        agents = {str(agent): version for agent, version in self.versions.items()}
        write_manifest(folder, self.model_dir, agents, self.model_name)
        return folder

    def saved(self, round_folder: Path) -> bool:
        """Whether ``save`` already wrote this round folder's weights."""
        folder = round_folder / self.folder_name
        return (folder / MANIFEST).is_file() if self.per_agent else folder.is_dir()

    def load(self, round_folder: Path, version: str) -> None:
        """Restore every member from what ``save`` wrote: one member at ``version``, per-agent adapters at the versions
        their manifest names (each agent must be in it)."""
        folder = round_folder / self.folder_name
        if not self.per_agent:
            self.updaters[None].load(folder)
            self.versions[None] = version
            return
        adapters = read_manifest(folder).get("adapters", {})
        missing = sorted(str(agent) for agent in set(self.updaters) - set(adapters))
        if missing:
            raise ValueError(f"{folder / MANIFEST}: no adapter for the agents {missing} listed in policies")
        for agent, updater in self.updaters.items():
            updater.load(folder / adapters[agent]["folder"])
            self.versions[agent] = str(adapters[agent]["version"])

    def sync(self, backend: PolicyBackend, round_folder: Path, members: Sequence[str | None] | None = None) -> None:
        """Serve the weights saved in ``round_folder`` (``members``, default all) at their versions; called before the
        publish that names them, so a resource never names a version the server does not have."""
        folder = round_folder / self.folder_name
        for member in self.updaters if members is None else members:
            if member is None:
                backend.sync(self.updaters[None], self.versions[None], folder)
            else:
                adapter, version = folder / adapter_folder(member), self.versions[member]
                self.served[member] = cast("AdapterServing", backend).sync_adapter(member, adapter, version)

    def optimizer_states(self) -> dict[str, Any]:
        """Each member's optimizer state, by agent (``""`` for one member), for checkpoints."""
        return {agent or "": updater.optimizer_state() for agent, updater in self.updaters.items()}

    def load_optimizer_states(self, states: Mapping[str, Any]) -> None:
        """Restore what ``optimizer_states`` returned."""
        for agent, updater in self.updaters.items():
            if (agent or "") not in states:
                raise ValueError(f"checkpoint: no optimizer state for the policy of {agent or 'every agent'!r}")
            updater.load_optimizer_state(states[agent or ""])
