"""Several decoding engines behind one ``submit``: a request goes to the replica that recently prefilled its prompt's
beginning (prefix affinity), else to the least loaded one; swaps and adapter loads reach every replica."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from agl.serving._engine import _Engine
from agl.serving._kv import MIN_REUSED_PREFIX
from agl.serving._requests import BASE, ServerStats, _AdapterLoad, _GenerationRequest, _Swap

AFFINITY_BLOCK = MIN_REUSED_PREFIX
"""Prompt tokens per block of the replicas' routing memory: a prompt's affinity to a replica is the number of its
leading blocks that replica prefilled recently."""

AFFINITY_SLACK = 2
"""How many more requests (queued or decoding) than the least loaded replica the replica holding a request's prompt
beginning may have and still get it. Prefilling a 260-token SQL-agent prompt again costs about seven decoding steps
of a full batch (SmolLM2-135M on one core: 750 ms against 107 ms), so a small imbalance is worth the reuse, a large
one is not."""

ROUTING_MEMORY_BLOCKS = 4096
"""Prompt blocks the router remembers per replica (a few hundred prompts; more than its prefix cache holds)."""


class _Replicas:
    """Several engines, each with its own copy of the model and its own worker thread, behind one ``submit``.

    torch releases the GIL inside its operators, so engines decoding with one intra-op thread each keep as many cores
    busy without the per-operator barrier of a multi-threaded team (which stalls whenever another process of the
    machine is busy). A request goes to the replica that recently prefilled the longest beginning of its prompt (a
    hash per ``AFFINITY_BLOCK`` tokens, chained, so equal hashes mean equal beginnings), unless that replica has more
    than ``AFFINITY_SLACK`` requests more than the least loaded one; otherwise to the least loaded one. Replicas do not
    share remembered prompts: affinity is what makes the prefix cache of each pay off.

    Weights commands reach every replica: a swap or adapter load is queued on all of them at once and returns when
    all have applied it, so a request submitted after it returns decodes on the new weights whichever replica takes
    it, and each replica still decodes every request entirely on one version (see ``_Engine``). Seeds are drawn per
    request before routing, so a seeded request samples the same tokens on any replica. One replica is just an
    engine.
    """

    def __init__(self, engines: list[_Engine]) -> None:
        if not engines:
            raise ValueError("at least one replica is needed")
        self.engines = engines
        self.weights_version = engines[0].weights_version
        self._route_lock = threading.Lock()
        self._seen: list[dict[int, None]] = [{} for _ in engines]  # per replica: recent block hashes, oldest first

    # -- what the server reads (every replica serves the same weights and adapters) -----------------------------

    @property
    def model(self) -> Any:
        return self.engines[0].model

    @property
    def max_batch_size(self) -> int:
        return self.engines[0].max_batch_size

    @property
    def threads(self) -> int:
        return self.engines[0].threads

    @property
    def base_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.engines[0].base_shapes

    @property
    def adapters(self) -> dict[str, str]:
        return self.engines[0].adapters

    @property
    def waiting(self) -> int:
        return sum(engine.waiting for engine in self.engines)

    @property
    def decoding(self) -> int:
        return sum(engine.decoding for engine in self.engines)

    @property
    def stats(self) -> ServerStats:
        return functools.reduce(lambda a, b: a + b, (engine.stats for engine in self.engines))

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def shutdown(self) -> None:
        """Stop every replica: each aborts its batch and fails its queued requests (503)."""
        for engine in self.engines:
            engine.shutdown()

    @contextmanager
    def hold(self) -> Iterator[None]:
        with ExitStack() as stack:
            for engine in self.engines:
                stack.enter_context(engine.hold())
            yield

    # -- requests and weights --------------------------------------------------------------------------------------

    def submit(self, request: _GenerationRequest) -> None:
        """Hand ``request`` to a replica: the one holding its prompt's beginning within the slack, else the least
        loaded (see the class docstring)."""
        if len(self.engines) == 1:
            self.engines[0].submit(request)
            return
        blocks = _block_hashes(request.adapter or BASE, request.prompt_ids)
        with self._route_lock:
            loads = [engine.load for engine in self.engines]
            lightest = min(loads)

            def preference(index: int) -> tuple[int, int]:
                seen = self._seen[index]
                matched = next((n for n, block in enumerate(blocks) if block not in seen), len(blocks))
                return matched, -loads[index]

            chosen = max((i for i in range(len(self.engines)) if loads[i] <= lightest + AFFINITY_SLACK), key=preference)
            self.engines[chosen].submit(request)
            seen = self._seen[chosen]
            for block in blocks:
                seen.pop(block, None)
                seen[block] = None
            while len(seen) > ROUTING_MEMORY_BLOCKS:
                del seen[next(iter(seen))]

    def swap(self, state_dict: Mapping[str, torch.Tensor], version: str, strict: bool, share: bool = False) -> None:
        """Install new weights on every replica (each between two of its batches); returns when all have. ``share``:
        every replica serves these very tensors (one copy for all)."""
        swaps = [_Swap(state_dict, version, strict, share) for _ in self.engines]
        for engine, swap in zip(self.engines, swaps, strict=True):
            engine.post(swap, engine._apply_swap)
        self._wait_all(swaps)
        self.weights_version = version

    def load_adapter(self, name: str, version: str, config: Any, weights: Mapping[str, torch.Tensor]) -> None:
        """Serve LoRA adapter ``name`` at ``version`` on every replica; returns when all do."""
        loads = [_AdapterLoad(name, version, config, weights) for _ in self.engines]
        for engine, load in zip(self.engines, loads, strict=True):
            engine.post(load, engine._apply_adapter)
        self._wait_all(loads)

    def forget_prompts(self) -> None:
        """Every replica drops its remembered prompts (each between two decoding steps); returns when all have."""
        for engine in self.engines:
            engine.forget_prompts()

    def _wait_all(self, commands: list[_Swap] | list[_AdapterLoad]) -> None:
        """Wait until every replica has applied its copy of a command (queued on all at once, so they drain in
        parallel), then raise the first error.

        Replicas are copies of one model with the same adapters, so a command fails on all of them or on none. The
        routing memory is forgotten: the replicas' remembered prompts of the replaced weights are gone.
        """
        for command in commands:
            command.done.wait()
        with self._route_lock:
            for seen in self._seen:
                seen.clear()
        for command in commands:
            if command.error is not None:
                raise command.error


def _block_hashes(adapter: str, prompt: list[int]) -> list[int]:
    """One hash per whole ``AFFINITY_BLOCK`` tokens of ``prompt``, each covering the adapter and every token before
    it, so two prompts share the first n hashes exactly when they share the first n blocks."""
    hashes: list[int] = []
    previous = hash(adapter)
    for start in range(0, len(prompt) - AFFINITY_BLOCK + 1, AFFINITY_BLOCK):
        previous = hash((previous, *prompt[start : start + AFFINITY_BLOCK]))
        hashes.append(previous)
    return hashes
