"""OpenAI-compatible HTTP server over a local Hugging Face causal LM (CPU), with exact token ids, logprobs and hot swap.

Concurrency model: uvicorn runs the FastAPI app on its own event loop in one background thread; handlers validate and
tokenize requests there and hand them to a replica (one by default; with more, each has its own copy of the model
and worker thread, and a request goes to the replica that recently prefilled its prompt's beginning, else to the
least loaded one). A replica's worker takes the first item of its FIFO queue, gathers up to ``max_batch_size``
requests queued behind it, and decodes them together (left padding, one KV cache, rows leaving the batch as they
finish, requests that arrive meanwhile joining it between steps). Weight swaps travel through every replica's queue,
so each applies them between batches, in arrival order, and a swap returns once all have: a request decodes entirely
on the weights that were current when it started. Results flow back to the handlers with
``loop.call_soon_threadsafe``. A request whose client disconnects stops decoding at the next step, streamed or not.
Nothing is persisted.

Wire format follows vLLM's OpenAI server when the request asks for ``"return_token_ids": true`` and
``"logprobs": true``: top-level ``prompt_token_ids`` (exactly the ids fed to the model), per-choice ``token_ids``
(exactly the ids sampled, never re-tokenized text, including a final end-of-turn token) and ``logprobs.content`` with
one entry per token id. Streaming sends ``prompt_token_ids`` in the first chunk and, in each later chunk, the ids new
in that chunk with their logprobs. Every response and chunk carries ``agl_weights_version``.

LoRA adapters: :meth:`PolicyServer.load_adapter` (or ``POST /v1/load_weights`` with ``"adapter"``) serves a peft
LoRA adapter as model ``<model_name>/<adapter>`` next to the base (``<model_name>``); rows of different adapters
decode in one batch, and each adapter's versions hot-swap on their own (see ``agl.serving._engine``). A request names
its adapter with ``model``; ``<model_name>/<name>`` for an adapter not loaded is answered 404 naming ``model``. Any
other model name is served by the base model (agents that name their own model keep working behind the gateway).
``GET /v1/models`` lists the base and each adapter with its ``agl_weights_version``; an answer carries the version of
the adapter (or base) that produced it.

Logprobs are those of the distribution the token was sampled from: ``log_softmax(logits / temperature)`` for the
sampled token (temperature 1 for a greedy request), before top-p truncation, as vLLM's ``processed_logprobs`` without
top-p and as TRL scores completions. LightningRL recomputes the same quantity from a forward pass over prompt +
response at the call's recorded temperature, so the importance ratio of the first update step is 1.

Sampling: ``temperature == 0`` is greedy; otherwise temperature then top-p (nucleus) sampling with a per-request
``torch.Generator``. Its seed is the request's ``seed``; without one, it is drawn from a server RNG seeded with the
server's ``seed`` in request-arrival order (repeatable runs, yet distinct samples for repeated prompts); with neither,
it is random. ``max_tokens`` is clamped to ``max_new_tokens_cap`` and to the room left in the model's context.
Fields of the OpenAI request that the server does not implement (penalties, ``logit_bias``, ...) are ignored;
``n`` must be 1.

Access: with an ``api_key`` (constructor, or env ``AGL_POLICY_TOKEN``) every route needs ``Authorization: Bearer
<api_key>`` (401 otherwise); the trainers start it with a fresh key and publish it as the ``LLM`` resource's
``api_key``, which agl's gateway sends and agents never see. ``POST /v1/load_weights`` loads only folders inside
``weights_root`` (403 naming ``path`` otherwise; without a ``weights_root`` it loads nothing over HTTP).
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import json
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from agl.core.net import bind
from agl.cpu import release_free_memory
from agl.precision import DtypeName, resolve_dtype
from agl.serving._chat_request import (
    ChatRequest,
    assistant_message,
    optional_bool,
    optional_int,
    optional_number,
    stop_strings,
    usage,
)
from agl.serving._engine import _Engine, decode_layout
from agl.serving._kv import PREFIX_CACHE_BYTES
from agl.serving._replicas import _Replicas
from agl.serving._requests import (
    BASE,
    MAX_TOP_LOGPROBS,
    SamplingParams,
    ServerStats,
    _Event,
    _Failed,
    _Finished,
    _GenerationRequest,
    _Started,
    _Token,
)
from agl.serving.chat_format import (
    RequestError,
    prepare_messages,
    template_supports_tools,
    validate_tool_choice,
    validate_tools,
)

# --------------------------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------------------------


class PolicyServer:
    """Serve a local causal LM (a ``save_pretrained`` folder) through an OpenAI-compatible API on loopback.

    Example::

        with PolicyServer(model_dir, seed=0) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="unused")
            reply = client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "2+2?"}], max_tokens=8,
                logprobs=True, extra_body={"return_token_ids": True},
            )
            server.load_weights(checkpoint_dir, version="v1")   # later responses report agl_weights_version "v1"

    The model and tokenizer load in the constructor; :meth:`start` launches the worker and the HTTP thread.

    ``api_key``: the bearer token every request must carry (default: env ``AGL_POLICY_TOKEN``; none: open, allowed
    on loopback only: :meth:`start` raises ValueError for another ``host``). ``weights_root``: the folder
    ``POST /v1/load_weights`` may load from (its subfolders included); without one, weights load only in-process
    (:meth:`load_weights`).

    ``replicas``: how many copies of the model decode side by side, each in its own worker thread, behind the one
    endpoint (a request goes to the replica that recently prefilled the beginning of its prompt, else to the least
    loaded; see ``agl.serving._replicas._Replicas``). Swaps and adapter loads reach every replica before they return;
    ``max_batch_size`` holds per replica. The default is one: on CPU a decoding step is bound by reading the
    weights, which a batch shares, so two half-full batches on two cores decoded no faster than one full batch on
    one (SmolLM2-135M, 2 cores, 8 SQL-agent runners: ``benchmarks/bench_sql_eval.py``); more replicas pay off where
    prefill (compute) dominates.

    ``threads`` is torch's intra-op thread count of each replica, which is process-wide: :meth:`start` sets it, for
    the decoding and for any other torch work of this process. The default gives the replicas together half the
    usable cores, at least one thread each: it leaves room for the runners, gateway and store that share the machine
    with a local policy; a team of threads per core makes decoding several times slower as soon as anything else is
    busy (separate single-threaded replicas do not wait for each other).

    ``prefix_cache_bytes``: memory for remembered prompt keys/values (a prompt that starts like a recent one prefills
    only the rest), shared equally by the replicas.

    ``dtype``: ``"auto"`` (default) runs the model in bf16 only on a CPU where bf16 matmuls are measured to be at
    least as fast as fp32 ones (:func:`agl.precision.fast_dtype`), else in fp32; logprobs are always computed in fp32
    from the logits. Pass ``"float32"`` when the served logprobs must match an fp32 trainer's recomputation exactly.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str = "policy",
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 8,
        max_new_tokens_cap: int = 1024,
        seed: int | None = None,
        weights_version: str = "v0",
        threads: int | None = None,
        replicas: int = 1,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        api_key: str | None = None,
        weights_root: str | Path | None = None,
        dtype: DtypeName = "auto",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_new_tokens_cap < 1:
            raise ValueError("max_new_tokens_cap must be >= 1")
        if prefix_cache_bytes < 0:
            raise ValueError("prefix_cache_bytes must be >= 0")
        replica_count, decoding_threads = decode_layout(replicas, threads)
        self.model_dir = Path(model_dir)
        self.model_name = model_name
        self.host = host
        self.api_key: str | None = api_key if api_key is not None else os.environ.get(POLICY_TOKEN_ENV) or None
        self.weights_root = Path(weights_root).resolve() if weights_root is not None else None
        self.max_new_tokens_cap = max_new_tokens_cap
        self.dtype = resolve_dtype(dtype, "cpu")
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype)
        model.eval()
        # Two tokenizer instances: the HTTP thread encodes while the worker decodes, and a Rust tokenizer must not be
        # used from two threads at once.
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self._engine = _Replicas(
            [
                _Engine(
                    model if index == 0 else copy.deepcopy(model),
                    AutoTokenizer.from_pretrained(self.model_dir),
                    max_batch_size=max_batch_size,
                    weights_version=weights_version,
                    threads=decoding_threads,
                    prefix_cache_bytes=prefix_cache_bytes // replica_count,
                )
                for index in range(replica_count)
            ]
        )
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self._native_tools = template_supports_tools(getattr(self.tokenizer, "chat_template", None))
        self._seed_rng = random.Random(seed) if seed is not None else None
        self._requested_port = port
        self._port: int | None = None
        self._socket: socket.socket | None = None
        self._uvicorn: uvicorn.Server | None = None
        self._http_thread: threading.Thread | None = None

    # -- public surface ----------------------------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The served ``transformers`` model of the first replica (its weights change on hot swap; every replica's
        copy holds the same ones once a swap has returned)."""
        return self._engine.model

    @property
    def replicas(self) -> int:
        """Copies of the model decoding side by side."""
        return len(self._engine.engines)

    @property
    def weights_version(self) -> str:
        """Version of the weights the next batch will use."""
        return self._engine.weights_version

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the policy server is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:43125/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def stats(self) -> ServerStats:
        """A snapshot of the workers' counters, summed over the replicas."""
        return self._engine.stats

    @property
    def waiting_requests(self) -> int:
        """Requests accepted but not yet taken into a batch."""
        return self._engine.waiting

    @property
    def running_requests(self) -> int:
        """Requests taken into a running batch (of any replica) that have not finished yet."""
        return self._engine.decoding

    @property
    def threads(self) -> int:
        """torch intra-op threads each replica decodes with (set process-wide by :meth:`start`)."""
        return self._engine.threads

    @contextmanager
    def hold_batches(self) -> Iterator[None]:
        """Let requests queue up until the block exits: no new batch starts and none joins a running one.

        The batch that follows takes the waiting requests of its replica together, up to ``max_batch_size``
        (with one replica, all of them). Weight swaps queued
        behind a held request wait as well. Useful to line up several clients deterministically, or to pause
        decoding around maintenance.
        """
        with self._engine.hold():
            yield

    def start(self) -> PolicyServer:
        """Start the worker and the HTTP server; returns once the port accepts connections."""
        if self._http_thread is not None:
            raise RuntimeError("the policy server is already started")
        from agl.core.net import is_loopback

        if not self.api_key and not is_loopback(self.host):
            raise ValueError(
                f"refusing to serve the policy on {self.host} without an api_key: anyone who can reach it could use "
                f"it and load weights into it; give api_key= (or {POLICY_TOKEN_ENV}), or listen on 127.0.0.1"
            )
        self._engine.start()
        sock = bind(self.host, self._requested_port)
        self._socket = sock
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self._build_app(), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
        self._uvicorn = uvicorn.Server(config)
        self._http_thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="agl-policy-http", daemon=True
        )
        self._http_thread.start()
        deadline = time.monotonic() + 60
        while not self._uvicorn.started:
            if not self._http_thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the policy server's HTTP thread failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Fail in-flight and queued requests with 503, stop the worker, then the HTTP server, and give the memory its
        requests used back to the OS (``release_free_memory``: a job goes on with other phases in this process; the
        weights go when the server is dropped). Idempotent."""
        self._engine.shutdown()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join()
        if self._socket is not None:
            self._socket.close()
        self._uvicorn = None
        self._http_thread = None
        self._socket = None
        self._port = None
        release_free_memory()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def forget_prompts(self) -> None:
        """Drop the keys/values of the prompts the server remembers (``prefix_cache_bytes`` at most) and give their
        memory back to the OS, between decoding steps; requests decoding go on. For a caller about to change the
        weights, which makes them useless anyway: an RL update forgets them before its step instead of holding both."""
        self._engine.forget_prompts()
        release_free_memory()

    def load_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], version: str, *, strict: bool = True, share: bool = False
    ) -> None:
        """Swap in new weights (tensors are copied) between batches; returns once later requests will use them.

        Keys and shapes are checked first, so a wrong state dict raises ``ValueError`` and leaves the model as it
        was. With ``strict=False`` a partial state dict (e.g. only some layers) is accepted. ``share``: serve these
        very tensors instead of copies (their dtype must be the server's), freeing the server's own: one copy of
        weights that another holder in this process (a LoRA updater's frozen base) never changes.
        """
        if not version:
            raise ValueError("version must be a non-empty string")
        expected = self._engine.base_shapes
        unknown = sorted(set(state_dict) - set(expected))
        missing = sorted(set(expected) - set(state_dict)) if strict else []
        mismatched = sorted(k for k, t in state_dict.items() if k in expected and tuple(t.shape) != expected[k])
        if share:
            mismatched += sorted(k for k, t in state_dict.items() if k in expected and t.dtype != self.dtype)
        if unknown or missing or mismatched:
            raise ValueError(
                f"state_dict does not fit the served model: unknown keys {unknown[:5]}, missing keys {missing[:5]}, "
                f"shape mismatches {mismatched[:5]}"
            )
        self._engine.swap(state_dict, version, strict, share)

    @property
    def adapters(self) -> dict[str, str]:
        """Each served LoRA adapter's name and its current version (served as model ``<model_name>/<name>``)."""
        return self._engine.adapters

    def load_adapter(self, name: str, path: str | Path, version: str) -> None:
        """Serve the peft LoRA adapter folder ``path`` (``adapter_config.json``) as adapter ``name``, version
        ``version``: model ``f"{model_name}/{name}"`` from now on, the base model unchanged.

        Loading a name already served replaces it for requests that start from now on; the requests decoding with the
        old version finish on it (no row ever mixes versions), and other adapters' rows go on undisturbed. Files are
        read in the calling thread; returns once later requests get this version. Raises ``ValueError`` for a bad
        name, version or folder, or an adapter that does not fit the model (then nothing changes).
        """
        if not isinstance(name, str) or not name or "/" in name or name == BASE:
            raise ValueError(f"adapter: {name!r} is not an adapter name (a non-empty string without '/')")
        if not version:
            raise ValueError("version must be a non-empty string")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise ValueError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
        from peft import LoraConfig, PeftConfig, load_peft_weights

        config = PeftConfig.from_pretrained(str(folder))
        if not isinstance(config, LoraConfig):
            raise ValueError(f"{folder} holds a {config.peft_type} adapter; the policy server serves LoRA adapters")
        if config.use_dora:
            raise ValueError(f"{folder} is a DoRA adapter; rows of several adapters cannot share a batch with DoRA")
        config.inference_mode = True
        self._engine.load_adapter(name, version, config, load_peft_weights(str(folder), device="cpu"))

    def load_weights(self, path: str | Path, version: str) -> None:
        """Swap in weights from ``path``: a ``save_pretrained`` folder, or a peft LoRA adapter folder.

        An adapter (``adapter_config.json`` present) is merged onto the server's original base weights from
        ``model_dir`` (not onto the currently served ones), so successive adapter versions replace each other.
        Loading happens in the calling thread; only the swap waits for the batch boundary. The loaded tensors are
        served themselves (``share``), not copied into the model: its previous weights are freed, and what the load
        left unchanged stays mapped from the file (one copy of Qwen2.5-Coder-0.5B in fp32 instead of three at once).
        """
        from transformers import AutoModelForCausalLM

        folder = Path(path)
        if (folder / "adapter_config.json").is_file():
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype)
            merged = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
            state_dict = merged.state_dict()
        elif (folder / "config.json").is_file():
            state_dict = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype).state_dict()
        else:
            raise ValueError(
                f"{folder} is neither a save_pretrained model folder (config.json) nor a peft adapter folder "
                "(adapter_config.json)"
            )
        self.load_state_dict(state_dict, version, share=True)

    # -- HTTP --------------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        # The endpoints reach the server through a weak proxy: FastAPI keeps every endpoint it has seen in a
        # module-level cache (``fastapi.dependencies.models``), so endpoints that held the server itself kept every
        # stopped server, its model (2.5 GB for Qwen2.5-Coder-0.5B) included, alive for the life of the process.
        server = weakref.proxy(self)
        app = FastAPI(title="agl policy server", docs_url=None, redoc_url=None)
        if self.api_key:
            app.add_middleware(_BearerKey, key=self.api_key)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "model": server.model_name, "weights_version": server.weights_version}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"object": "model", "created": 0, "owned_by": "agl", "max_model_len": server.context_length}
            data = [{"id": server.model_name, **card, "agl_weights_version": server.weights_version}]
            for name, version in sorted(server.adapters.items()):
                data.append(
                    {
                        "id": f"{server.model_name}/{name}",
                        **card,
                        "parent": server.model_name,
                        "agl_weights_version": version,
                    }
                )
            return {"object": "list", "data": data}

        @app.post("/v1/load_weights")
        async def load_weights(request: Request) -> Response:
            body = await _json_body(request)
            if isinstance(body, Response):
                return body
            path, version, adapter = body.get("path"), body.get("version"), body.get("adapter")
            if adapter is not None and (not isinstance(adapter, str) or not adapter or "/" in adapter):
                return _error(400, "adapter", "must be an adapter name (a non-empty string without '/')")
            if not isinstance(path, str) or not path:
                return _error(400, "path", "must be a non-empty string")
            if server.weights_root is None:
                return _error(403, "path", "this server loads no weights over HTTP (started without weights_root)")
            if not Path(path).resolve().is_relative_to(server.weights_root):
                return _error(403, "path", f"{path} is not inside the weights root {server.weights_root}")
            if not Path(path).is_dir():
                return _error(400, "path", f"{path} is not a directory on the server")
            if not isinstance(version, str) or not version:
                return _error(400, "version", "must be a non-empty string")
            try:
                if adapter is None:
                    await run_in_threadpool(server.load_weights, path, version)
                else:
                    await run_in_threadpool(server.load_adapter, adapter, path, version)
            except (ValueError, OSError) as exc:  # not a model/adapter folder, or one that does not fit the model
                return _error(400, "path", str(exc))
            except RuntimeError as exc:
                return _error(503, None, str(exc))
            served = server.weights_version if adapter is None else server.adapters[adapter]
            return JSONResponse({"status": "ok", "agl_weights_version": served})

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body = await _json_body(request)
            if isinstance(body, Response):
                return body
            try:
                chat = server._parse_chat(body)
            except _UnknownModel as exc:
                return _error(404, "model", str(exc))
            except RequestError as exc:
                return _error(400, exc.field, str(exc))
            events: asyncio.Queue[_Event] = asyncio.Queue()
            loop = asyncio.get_running_loop()

            def deliver(event: _Event) -> None:
                try:
                    loop.call_soon_threadsafe(events.put_nowait, event)
                except RuntimeError:  # the event loop is gone: the server is stopping
                    generation.cancelled.set()

            generation = _GenerationRequest(
                chat.prompt_ids, chat.params, chat.stream, chat.tool_mode, deliver, adapter=chat.adapter
            )
            try:
                server._engine.submit(generation)
            except RuntimeError as exc:
                return _error(503, None, str(exc))
            if chat.stream:
                return StreamingResponse(server._stream(chat, generation, events), media_type="text/event-stream")
            try:
                return await _unless_disconnected(request, server._complete(chat, events))
            finally:
                generation.cancelled.set()

        return app

    def _parse_chat(self, body: Mapping[str, Any]) -> ChatRequest:
        """Validate an OpenAI chat-completions body and tokenize its prompt; raises :class:`RequestError`."""
        model = body.get("model", self.model_name)
        if not isinstance(model, str):
            raise RequestError("model", "must be a string")
        adapter = self._adapter_of(model)
        n = optional_int(body, "n", 1)
        if n not in (None, 1):
            raise RequestError("n", "only n=1 is supported; send several requests (they are batched together)")
        tools = validate_tools(body.get("tools"))
        tool_choice = validate_tool_choice(body.get("tool_choice"), tools)
        messages = prepare_messages(
            body.get("messages"), tools=tools, tool_choice=tool_choice, native_tools=self._native_tools
        )
        prompt_ids = self._encode(messages, tools if (self._native_tools and tool_choice != "none") else None)
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise RequestError(
                "messages", f"the prompt is {len(prompt_ids)} tokens; the model's context is {self.context_length}"
            )
        max_tokens = optional_int(body, "max_completion_tokens", 1) or optional_int(body, "max_tokens", 1)
        max_tokens = min(max_tokens or self.max_new_tokens_cap, self.max_new_tokens_cap, room)
        logprobs = optional_bool(body, "logprobs")
        top_logprobs = optional_int(body, "top_logprobs", 0) or 0
        if top_logprobs > MAX_TOP_LOGPROBS:
            raise RequestError("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}")
        if top_logprobs and not logprobs:
            raise RequestError("top_logprobs", "requires logprobs: true")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise RequestError("seed", "must be an integer")
        if seed is None and self._seed_rng is not None:
            seed = self._seed_rng.randrange(2**63)
        stream = optional_bool(body, "stream")
        stream_options = body.get("stream_options")
        if stream_options is not None and not isinstance(stream_options, Mapping):
            raise RequestError("stream_options", "must be an object")
        include_usage = optional_bool(stream_options or {}, "include_usage")
        params = SamplingParams(
            temperature=optional_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=optional_number(body, "top_p", 1.0, 0.0, 1.0),
            max_tokens=max_tokens,
            stop=stop_strings(body.get("stop")),
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )
        return ChatRequest(
            model=model,
            adapter=adapter,
            prompt_ids=prompt_ids,
            params=params,
            stream=stream,
            include_usage=include_usage,
            return_token_ids=optional_bool(body, "return_token_ids"),
            tool_mode=bool(tools) and tool_choice != "none",
        )

    def _adapter_of(self, model: str) -> str | None:
        """The adapter a request's ``model`` names (None: the base); raises :class:`_UnknownModel` for
        ``<model_name>/<name>`` when no adapter ``name`` is served."""
        prefix, _, name = model.partition("/")
        if prefix != self.model_name or not name:
            return None
        if name not in self._engine.adapters:
            served = ", ".join(f"{self.model_name}/{known}" for known in sorted(self._engine.adapters)) or "none"
            raise _UnknownModel(
                "model", f"the model `{model}` does not exist: no adapter {name!r} is loaded (adapters: {served})"
            )
        return name

    def _encode(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        try:
            encoded = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True
            )
        except Exception as exc:  # jinja errors raised by the template for messages it does not accept
            raise RequestError("messages", f"the model's chat template rejected them: {exc}") from exc
        ids: Any = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
        return [int(i) for i in ids]

    async def _complete(self, chat: ChatRequest, events: asyncio.Queue[_Event]) -> Response:
        version = self.weights_version
        while True:
            event = await events.get()
            if isinstance(event, _Started):
                version = event.weights_version
            elif isinstance(event, _Failed):
                return _error(event.status, None, event.message)
            elif isinstance(event, _Finished):
                break
        message, finish_reason = assistant_message(chat, event)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": event.logprobs} if event.logprobs is not None else None,
            "finish_reason": finish_reason,
        }
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": chat.model,
            "choices": [choice],
            "usage": usage(chat, event),
            "agl_weights_version": version,
        }
        if chat.return_token_ids:
            choice["token_ids"] = event.token_ids
            body["prompt_token_ids"] = chat.prompt_ids
        return JSONResponse(body)

    async def _stream(
        self, chat: ChatRequest, generation: _GenerationRequest, events: asyncio.Queue[_Event]
    ) -> AsyncIterator[str]:
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        version = self.weights_version
        sent = ""

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            payload = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": chat.model,
                "choices": choices,
                "agl_weights_version": version,
                **extra,
            }
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        try:
            while True:
                event = await events.get()
                if isinstance(event, _Started):
                    version = event.weights_version
                    extra = {"prompt_token_ids": chat.prompt_ids} if chat.return_token_ids else {}
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    yield chunk([{**first, "finish_reason": None}], **extra)
                elif isinstance(event, _Token):
                    sent += event.text_delta
                    choice: dict[str, Any] = {
                        "index": 0,
                        "delta": {"content": event.text_delta},
                        "logprobs": {"content": [event.logprob]} if event.logprob is not None else None,
                        "finish_reason": None,
                    }
                    if chat.return_token_ids:
                        choice["token_ids"] = [event.token_id]
                    yield chunk([choice])
                elif isinstance(event, _Failed):
                    error = {"message": event.message, "type": "server_error", "param": None, "code": event.status}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    break
                else:
                    message, finish_reason = assistant_message(chat, event)
                    final = message["content"] or ""
                    delta: dict[str, Any] = {"content": final[len(sent) :] if final.startswith(sent) else ""}
                    if "tool_calls" in message:
                        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                    yield chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])
                    if chat.include_usage:
                        yield chunk([], usage=usage(chat, event))
                    break
            yield "data: [DONE]\n\n"
        finally:
            generation.cancelled.set()


class _UnknownModel(RequestError):
    """A request names an adapter the server does not serve (answered 404)."""


async def _unless_disconnected(request: Request, answer: Coroutine[Any, Any, Response]) -> Response:
    """Await ``answer``, or give up as soon as the client disconnects (then nobody reads the response).

    Starlette does not cancel a plain handler whose client went away; without this watch a request abandoned by a
    client that timed out (or by a killed runner) would decode to its token cap while newer requests wait.
    """

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answering = asyncio.ensure_future(answer)
    watching = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({answering, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not answering.done():
            answering.cancel()  # takes effect at its next await: ``answering`` is not done yet
    if not answering.done() or answering.cancelled():
        return _error(499, None, "the client disconnected before the response was ready")
    return answering.result()


async def _json_body(request: Request) -> dict[str, Any] | Response:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "body", "must be valid JSON")
    if not isinstance(body, dict):
        return _error(400, "body", "must be a JSON object")
    return body


#: The environment variable a ``PolicyServer`` without an ``api_key`` argument reads its key from.
POLICY_TOKEN_ENV = "AGL_POLICY_TOKEN"

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _BearerKey:
    """ASGI middleware: a request without ``Authorization: Bearer <key>`` is answered 401 (constant-time check)."""

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]], key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = bytes(value).strip().partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else b""
        if hmac.compare_digest(given, self.key):
            await self.app(scope, receive, send)
            return
        what = "no bearer token" if not given else "a wrong bearer token"
        response = _error(401, None, f"the policy server needs its api_key as 'Authorization: Bearer <key>' ({what})")
        response.headers["www-authenticate"] = 'Bearer realm="agl-policy"'
        await response(scope, receive, send)


def _error(status: int, param: str | None, message: str) -> JSONResponse:
    """An OpenAI-shaped error body; for a client mistake ``message`` starts with the offending field's name."""
    text = message if param is None or message.startswith(f"{param}:") else f"{param}: {message}"
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": text, "type": kind, "param": param, "code": status}}, status_code=status)
