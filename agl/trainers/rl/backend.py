"""Where the policy is served during RL, and how new weights reach it between rounds.

Two backends, chosen by ``LightningRLConfig.backend``:

* ``local``: an ``agl.serving.PolicyServer`` started in this process on the base model; new weights are copied into it
  in memory (``load_state_dict``), and every response reports the served ``agl_weights_version``.
* ``vllm``: vLLM's OpenAI server (``agl.serving.vllm.VllmServer``) started by agl on the base model, on a GPU or with
  vLLM's CPU build (``LightningRLConfig.vllm``). A LoRA version is registered live with
  ``POST /v1/load_lora_adapter`` and served under its own model name, so rollouts of a version ask for exactly that
  adapter; full weights are reloaded in place by vLLM's own RL update path, proved by the served log-probabilities of
  a probe text against the trainer's, or (``VllmConfig.weight_sync``, or when that fails) the server restarts on the
  new folder under the new version's name. ``last_sync`` says which ran (the round's ``weight_sync`` metric).

With per-agent policies (``LightningRLConfig.policies``) either backend serves the base model plus one LoRA adapter
per agent, each new version added by ``sync_adapter``, which returns the model name that reaches it: the local server
serves an agent's adapter under one name (``policy/writer``) and swaps versions behind it; vLLM serves each version
under its own name (``writer@v3``), older versions staying registered for requests in flight.

Both are driven by one thread (the algorithm's); ``sync`` returns once later requests use the new weights.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agl.serving.vllm import VllmConfig


class WeightsSource(Protocol):
    """What a backend needs from the trainer: merged full weights (``state_dict``), and the policy's log-probabilities
    of a text (``prompt_logprobs``), to prove that a server serves them."""

    def state_dict(self) -> dict[str, Any]: ...

    def prompt_logprobs(self, text: str) -> tuple[list[int], list[float]]: ...


#: The text whose log-probabilities prove an in-place sync (served against the trainer's).
PROBE = "Write one SQL query that counts the orders of each customer, newest first."


class PolicyBackend(Protocol):
    """A served policy whose weights the RL loop replaces between rounds."""

    @property
    def base_url(self) -> str:
        """OpenAI base URL (ends with ``/v1``)."""

    @property
    def model(self) -> str:
        """The model name rollouts must request for the current weights."""

    @property
    def api_key(self) -> str:
        """The key the endpoint requires (published as the LLM resource's ``api_key``; only the gateway sends it)."""

    def start(self) -> None:
        """Make the endpoint ready to serve."""

    def sync(self, weights: WeightsSource, version: str, folder: Path) -> None:
        """Serve the weights of ``weights`` (also saved in ``folder``) as ``version`` from now on."""

    @property
    def last_sync(self) -> str | None:
        """How the last ``sync`` reached the server (``memory``, ``adapter``, ``inplace``, ``restart``); None before."""

    def before_update(self) -> None:
        """The weights are about to change: free what serves only the current ones (the remembered prompts)."""

    def stop(self) -> None:
        """Release what ``start`` took (idempotent)."""


class LocalBackend:
    """An in-process ``PolicyServer`` on ``model_dir``; weights are hot-swapped in memory.

    It serves in fp32, the precision ``PolicyUpdater`` scores in, even on a CPU where bf16 is faster: the behaviour
    logprobs the server reports must be the policy's own, or the first update step's importance ratios are not 1 (a
    bf16 sampler measured 0.04 off in log-probability on a tiny model) and clipping acts on the precision gap."""

    #: The name a single policy's LoRA adapter is served under (``model/trained``).
    TRAINED = "trained"

    def __init__(
        self, model_dir: Path, *, model_name: str, seed: int | None, max_batch_size: int, version: str
    ) -> None:
        from agl.serving.policy_server import PolicyServer

        self._served: str | None = None  # the adapter's model name once a LoRA round is served
        self._last_sync: str | None = None

        self.server = PolicyServer(
            model_dir,
            model_name=model_name,
            seed=seed,
            max_batch_size=max_batch_size,
            weights_version=version,
            api_key=secrets.token_urlsafe(32),
            dtype="float32",
        )

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model(self) -> str:
        return self._served or self.server.model_name

    @property
    def api_key(self) -> str:
        assert self.server.api_key is not None
        return self.server.api_key

    def start(self) -> None:
        self.server.start()

    def share_base(self, frozen: dict[str, Any]) -> None:
        """Serve the base model from ``frozen``, a LoRA updater's base weights in this process (never trained), and
        free the server's own copy: one copy of the base for training and serving."""
        self.server.load_state_dict(frozen, self.server.weights_version, share=True)

    def sync(self, weights: WeightsSource, version: str, folder: Path) -> None:
        """A LoRA round is served as an adapter over the base (nothing merged, the base never rewritten, so it can
        stay shared with the updater); full weights are copied into the served model."""
        if (folder / "adapter_config.json").is_file():
            self._served = self.sync_adapter(self.TRAINED, folder, version)
            self._last_sync = "adapter"
        else:
            self.server.load_state_dict(weights.state_dict(), version)
            self._last_sync = "memory"

    @property
    def last_sync(self) -> str | None:
        return self._last_sync

    def sync_adapter(self, name: str, folder: Path, version: str) -> str:
        """Serve the peft LoRA adapter in ``folder`` as model ``f"{model}/{name}"`` at ``version`` from now on (added,
        or replacing that name's previous version); the base model and the other adapters are unchanged. Returns
        the model name."""
        from agl.trainers._weights import adapter_model

        self.server.load_adapter(name, folder, version)
        self._last_sync = "adapter"
        return adapter_model(self.server.model_name, name)

    def before_update(self) -> None:
        """The update shares this process's memory: the server's remembered prompts (up to its prefix budget, 512
        MiB by default), of no use once the weights change, are dropped first."""
        self.server.forget_prompts()

    def stop(self) -> None:
        self.server.stop()


#: How far served log-probabilities of ``PROBE`` may be from the trainer's after an in-place sync: fp32 on both
#: sides on a CPU (different kernels: ~1e-5 measured), vLLM's bf16 against fp32 on a GPU.
CPU_TOLERANCE = 1e-3
GPU_TOLERANCE = 0.1


class VllmBackend:
    """vLLM (GPU or its CPU build), launched and owned by agl (``agl.serving.vllm.VllmServer``).

    A LoRA round is loaded at run time (``/v1/load_lora_adapter``, served under the version's name); full weights are
    reloaded in place by vLLM's own update path and proved by served log-probabilities, or the server restarts on the
    new folder (``VllmConfig.weight_sync``; ``agl.serving.vllm``).
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        version: str,
        lora: bool,
        max_lora_rank: int,
        max_loras: int | None = None,
        config: VllmConfig | None = None,
    ) -> None:
        from agl.serving.vllm import VllmConfig, VllmServer

        options = (config or VllmConfig()).server_options()
        self.server = VllmServer(
            model_dir,
            weights_version=version,
            enable_lora=lora,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            **options,
        )

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model(self) -> str:
        return self.server.model_name

    @property
    def api_key(self) -> str:
        return self.server.api_key

    def start(self) -> None:
        self.server.start()

    def sync(self, weights: WeightsSource, version: str, folder: Path) -> None:
        """A LoRA round is registered live; full weights reload in place (``VllmConfig.weight_sync``), proved by the
        served log-probabilities of ``PROBE`` against ``weights``' own, or the server restarts on them."""
        adapter = (folder / "adapter_config.json").is_file()
        self.server.sync_weights(folder, version, adapter=adapter, check=lambda: self._check(weights))

    def _check(self, weights: WeightsSource) -> None:
        """Raise ``InPlaceSyncError`` unless the served log-probabilities of ``PROBE`` are ``weights``' (within the
        precision the server computes in: fp32 on a CPU, vLLM's bf16 on a GPU)."""
        from agl.serving.vllm import InPlaceSyncError

        ids, expected = weights.prompt_logprobs(PROBE)
        served = self.server.prompt_logprobs(ids)
        worst = max(abs(a - b) for a, b in zip(served, expected, strict=True))
        tolerance = CPU_TOLERANCE if self.server.device == "cpu" else GPU_TOLERANCE
        if worst > tolerance:
            raise InPlaceSyncError(
                f"served log-probabilities are {worst:.2e} from the new weights' (tolerance {tolerance:g})"
            )

    @property
    def last_sync(self) -> str | None:
        return self.server.last_sync

    def sync_adapter(self, name: str, folder: Path, version: str) -> str:
        """Register version ``version`` of agent ``name``'s LoRA adapter (``folder``) with vLLM, live; returns its
        model name, ``f"{name}@{version}"`` (earlier versions stay registered for requests already sent)."""
        return self.server.load_adapter(name, folder, version)

    def before_update(self) -> None:
        """Nothing: vLLM allocates its KV cache once, in its own process, so dropping cached prefixes frees nothing."""

    def stop(self) -> None:
        self.server.stop()
