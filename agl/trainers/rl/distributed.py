"""LightningRL's policy update on several processes: data parallel over torch.distributed
(``UpdateConfig.strategy = "ddp"``).

Started as ``torchrun --nproc-per-node N script.py`` (or any launcher that sets torchrun's environment), every rank
runs the same script. Rank 0 runs the whole loop (store, server, runners, rollouts, checkpoints); every other rank
builds the same policies and follows (``Trainer.fit`` calls ``LightningRL.follow`` there, which starts nothing else).
For each optimizer step:

1. rank 0 computes the step's normaliser over all its transitions (``LossConfig.aggregation``), splits the calls that
   train into token-balanced, non-empty shards (``shard_transitions``: calls sharing a prompt stay together, so each
   rank still scores their prefix once) and scatters them;
2. every rank scores its shard and accumulates the gradient of its share of the step loss (the same loss, clipping
   and advantages as one process);
3. one all-reduce sums the gradients (gloo on a CPU, NCCL on GPUs), and every rank clips and applies the same AdamW
   step: the replicas stay equal, and rank 0's weights are the policy that is served and saved.

Why not ``DistributedDataParallel``'s wrapper: its reducer expects every rank to run the same number of forward
passes through the wrapped module, while shards have as many micro-batches as their tokens need, and shared-prefix
scoring calls the decoder and the output layer directly. One all-reduce of the accumulated gradient after the last
micro-batch is what DDP does with ``no_sync`` over gradient accumulation, without those constraints.

Messages (the shards, a state broadcast after a checkpoint is loaded, the stop at the end) travel as pickled objects
over the same group, or over a gloo group beside NCCL. A rank that dies ends its peers' next collective with an
error that names the step (``UpdateGroupError``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from agl.core.types import Transition

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: How long a rank waits in a collective. Followers wait for rank 0 through whole rounds of rollouts (minutes to
#: hours), so the limit is long; a rank that dies closes its sockets and ends the wait at once.
WAIT = timedelta(hours=12)

#: The environment torchrun sets for every rank.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class UpdateGroupError(RuntimeError):
    """A collective of the distributed update failed: a rank died, or the group was never formed."""


def env_rank() -> int:
    """This process's rank as torchrun set it (``RANK``), 0 outside torchrun. Reads no torch."""
    return int(os.environ.get("RANK", "0"))


def shard_transitions(transitions: Sequence[Transition], world: int) -> list[list[Transition]]:
    """Split ``transitions`` into ``world`` shards with about the same tokens each: every transition in exactly one
    shard, in its original order within a shard, and every shard non-empty when there are at least ``world``
    transitions (with fewer, the last ranks get none and only take part in the gradient sum; a warning says so).
    Calls with the same prompt (a GRPO group) stay in one shard while there are enough other units to fill every
    rank, so their prefix is scored once."""
    if world < 1:
        raise ValueError(f"world: must be >= 1, got {world}")
    if len(transitions) < world:
        log.warning(
            "%d transition(s) to train on for %d ranks: %d rank(s) idle this step",
            len(transitions),
            world,
            world - len(transitions),
        )
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(transitions):
        by_prompt.setdefault(tuple(t.prompt_ids), []).append(i)

    def cost(unit: list[int]) -> int:  # the prompt once (shared-prefix scoring), every response
        return len(transitions[unit[0]].prompt_ids) + sum(len(transitions[i].response_ids) for i in unit)

    units = sorted(by_prompt.values(), key=cost, reverse=True)
    while len(units) < min(world, len(transitions)):  # too few prompts: halve the costliest group that can be
        k = next(n for n, unit in enumerate(units) if len(unit) > 1)
        unit = units.pop(k)
        units.extend([unit[: len(unit) // 2], unit[len(unit) // 2 :]])
        units.sort(key=cost, reverse=True)
    shards: list[list[int]] = [[] for _ in range(world)]
    loads = [0] * world
    for unit in units:  # longest first, to the lightest shard: every shard gets one of the first `world` units
        rank = min(range(world), key=lambda r: (loads[r], r))
        shards[rank].extend(unit)
        loads[rank] += cost(unit) or 1
    return [[transitions[i] for i in sorted(shard)] for shard in shards]


@dataclass
class Message:
    """What rank 0 sends the followers: ``step`` (a shard and the step's normaliser), ``state`` (receive the
    trainable weights and the optimizer state from rank 0), or ``stop``. ``member`` names the policy
    (``PolicySet.updaters``' key)."""

    kind: str
    member: str | None = None
    shard: list[Transition] = field(default_factory=list)
    normalizer: float = 0.0


class UpdateGroup:
    """The process group of a distributed update, formed once per process from torchrun's environment.

    Example (what ``LightningRL`` does; rank 0 leads, the others follow until it stops them)::

        group = UpdateGroup.join()
        if group.rank == 0:
            ...  # updater.step(transitions) scatters the shards itself
            group.stop()
        else:
            follow(group, {None: updater})
    """

    _joined: UpdateGroup | None = None

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        missing = [name for name in TORCHRUN_ENV if name not in os.environ]
        if not dist.is_initialized():
            if missing:
                raise UpdateGroupError(
                    f"strategy 'ddp' needs torch.distributed's environment ({', '.join(missing)} unset): start the "
                    "script with `torchrun --nproc-per-node N script.py`"
                )
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":  # one GPU per rank: this rank's is the current device, what "cuda" means
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=WAIT)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        #: Objects travel over gloo: NCCL moves only GPU tensors.
        self.messages = dist.new_group(backend="gloo", timeout=WAIT) if dist.get_backend() == "nccl" else None
        self.steps = 0

    @classmethod
    def join(cls) -> UpdateGroup:
        """This process's group (formed on the first call)."""
        if cls._joined is None:
            cls._joined = cls()
        return cls._joined

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def threads(self) -> int:
        """Intra-op threads for this rank's share of the step: the usable cores over the ranks on this machine."""
        from agl.cpu import usable_cores

        return max(1, usable_cores() // max(1, self.local_world))

    def _collective(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except RuntimeError as exc:  # gloo: "Connection closed by peer", "Timed out", ...
            raise UpdateGroupError(
                f"distributed update, rank {self.rank} of {self.world}, {what} after {self.steps} step(s): {exc} "
                "(did another rank die? its log says why)"
            ) from exc

    def send(self, messages: list[Message]) -> Message:
        """Rank 0: give rank r ``messages[r]``; returns rank 0's own."""
        import torch.distributed as dist

        if len(messages) != self.world:
            raise ValueError(f"send: {len(messages)} messages for {self.world} ranks")
        out: list[Any] = [None]
        self._collective("sending", dist.scatter_object_list, out, list(messages), src=0, group=self.messages)
        received: Message = out[0]
        return received

    def receive(self) -> Message:
        """A follower: wait for rank 0's next message."""
        import torch.distributed as dist

        out: list[Any] = [None]
        self._collective("waiting for rank 0", dist.scatter_object_list, out, None, src=0, group=self.messages)
        received: Message = out[0]
        return received

    def sum_(self, tensor: torch.Tensor, what: str) -> None:
        """All-reduce ``tensor`` in place (sum over the ranks)."""
        import torch.distributed as dist

        self._collective(what, dist.all_reduce, tensor, op=dist.ReduceOp.SUM)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's, in place."""
        import torch.distributed as dist

        self._collective("sending weights", dist.broadcast, tensor, src=0)

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        import torch.distributed as dist

        box = [value]
        self._collective("sending state", dist.broadcast_object_list, box, src=0, group=self.messages)
        return box[0]

    def stop(self) -> None:
        """Rank 0: end the followers' ``follow`` loops. A follower already gone is logged, not raised: ``stop`` runs
        when rank 0's fit ends, however it ends."""
        try:
            self.send([Message("stop") for _ in range(self.world)])
        except UpdateGroupError as exc:
            log.warning("could not stop every follower: %s", exc)


class Follower(Protocol):
    """A follower rank's side of a policy's update (``PolicyUpdater``)."""

    def follow_step(self, shard: Sequence[Transition], normalizer: float) -> None:
        """Score ``shard`` in the step rank 0 leads and apply the step."""
        ...

    def receive_state(self) -> None:
        """Take rank 0's weights and optimizer state."""
        ...


def follow(group: UpdateGroup, updaters: Mapping[str | None, Follower]) -> int:
    """A follower's loop: take part in every step and state broadcast rank 0 leads, until it sends ``stop``. Returns
    the steps taken."""
    if group.leads:
        raise ValueError("follow: rank 0 leads the update; only the other ranks follow")
    log.info("rank %d of %d follows the update", group.rank, group.world)
    while True:
        message = group.receive()
        if message.kind == "stop":
            return group.steps
        if message.member not in updaters:
            raise UpdateGroupError(f"rank {group.rank}: rank 0 sent a step for unknown policy {message.member!r}")
        updater = updaters[message.member]
        if message.kind == "step":
            updater.follow_step(message.shard, message.normalizer)
        elif message.kind == "state":
            updater.receive_state()
        else:
            raise UpdateGroupError(f"rank {group.rank}: unknown message {message.kind!r} from rank 0")
