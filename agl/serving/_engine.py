"""The decoding engine of the local policy server: one worker thread that owns the model and decodes batches.

Concurrency model: requests and weight swaps arrive on one FIFO queue. The worker takes the first waiting item,
gathers up to ``max_batch_size`` requests queued behind it, and decodes them together (left padding, one KV cache).
Each request is prefilled on its own (one prompt per forward pass) and its KV cache left-padded into the batch's.
Rows leave the batch as they finish, and requests that arrive while it runs join it between two decoding steps, so a
short request never waits for a long one to end. A swap ends admission: the running batch drains, the swap is
applied, and the requests queued behind it start the next batch, so every request decodes entirely on one version of
the weights. A prompt that starts like one prefilled recently (an agent's system prompt and schema) reuses its
keys/values and prefills only the rest; the remembered prompts are kept within a memory budget, least recently used
first out, and a swap forgets them. Results go back through callbacks.

Replicas (``_Replicas``): a server may run several engines, each with its own copy of the model and its own worker
thread, behind one ``submit``; a request goes to the replica that recently prefilled its prompt's beginning (prefix
affinity), else to the least loaded one, and swaps and adapter loads are applied by every replica before they return.

LoRA adapters: the engine serves the base model plus any number of named peft LoRA adapters. The first one wraps the
model in a ``PeftModel``; each row of a batch names the adapter it decodes with (``"__base__"`` for the base), and
every forward pass applies each row's own adapter (peft's mixed-batch ``adapter_names``), so rows of different
adapters decode in one step. Each loaded version of an adapter is its own peft adapter: loading a new version of
``name`` (through the queue, in order) adds it next to the old one without draining anything; rows admitted before
keep the version they started on, rows admitted after get the new one, and the old version is deleted once its last
row has left. Prompt-prefix keys/values are remembered per peft adapter (they depend on its weights).

Threads: torch's intra-op thread count is process-wide. Each worker decodes with ``threads`` of them
(``decode_layout``) and sets that when it starts. A local policy server shares its machine with the runners, the
gateway and the store; with a thread per core, every other busy thread stalls the decoding team at each operator's
barrier (measured on 2 busy cores: one decoding step 6x slower than with one thread). Single-threaded replicas use
the cores without that barrier: torch releases the GIL inside its operators, so they run side by side.
"""

from __future__ import annotations

import functools
import inspect
import queue
import random
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from agl.core.types import logprob_temperature
from agl.cpu import pin_mmap_threshold, usable_cores
from agl.serving._kv import PREFIX_CACHE_BYTES, _cache_layers, _left_pad, _new_cache, _PromptPrefixes
from agl.serving._requests import (
    _SHUTDOWN,
    BASE,
    ServerStats,
    _AdapterLoad,
    _Failed,
    _Finished,
    _Forget,
    _GenerationRequest,
    _Shutdown,
    _Started,
    _Swap,
    _Token,
    _WeightsCommand,
)
from agl.serving._token_text import _TokenText
from agl.serving.chat_format import StreamingContent, first_stop

# --------------------------------------------------------------------------------------------------------------------
# The generation engine (worker thread)
# --------------------------------------------------------------------------------------------------------------------


class _Row:
    """Decoding state of one request inside a batch."""

    def __init__(
        self,
        request: _GenerationRequest,
        text_of: Callable[[list[int]], str],
        on_end: Callable[[], None],
        adapter_key: str = BASE,
        version: str = "",
    ) -> None:
        self.request = request
        self.adapter_key = adapter_key  # the peft adapter (one version of one LoRA adapter) it decodes with
        self.version = version
        self.params = request.params
        self.generated: list[int] = []
        self.logprobs: list[dict[str, Any]] = []
        self.position = len(request.prompt_ids) - 1
        self.done = False
        self._on_end = on_end
        self._text_of = text_of
        self._needs_text = request.stream or bool(self.params.stop)
        self._text = ""
        self._stream = StreamingContent(self.params.stop, request.tool_mode) if request.stream else None
        self.generator: torch.Generator | None = None
        if self.params.temperature > 0:
            seed = self.params.seed if self.params.seed is not None else random.SystemRandom().randrange(2**63)
            self.generator = torch.Generator().manual_seed(seed)

    @property
    def last_token(self) -> int:
        return self.generated[-1]

    def end(self, event: _Finished | _Failed | None) -> None:
        """Leave the batch (once), sending ``event`` as the request's last one; None when its client has gone."""
        if not self.done:
            self.done = True
            self._on_end()
            if event is not None:
                self.request.deliver(event)

    def add(self, token_id: int, logprob: dict[str, Any] | None, stop_ids: frozenset[int]) -> bool:
        """Record a sampled token and stream it; when the row is done, send its final event and return True."""
        self.generated.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
        finish: str | None = None
        text: str | None = None
        if self._needs_text:
            self._text = self._text_of(self.generated)
        if token_id in stop_ids:
            finish = "stop"
        elif self.params.stop and (cut := first_stop(self._text, self.params.stop)) is not None:
            finish, text = "stop", self._text[:cut]
        elif len(self.generated) >= self.params.max_tokens:
            finish = "length"
        if self._stream is not None:
            delta = self._stream.update(self._text) if finish is None else ""
            self.request.deliver(_Token(token_id, logprob, delta))
        if finish is None:
            return False
        if text is None:
            text = self._text_of(self.generated)
        self.end(_Finished(list(self.generated), self.logprobs if self.params.logprobs else None, text, finish))
        return True


@dataclass
class _Batch:
    """Rows decoding together: their KV cache and attention mask cover every token but each row's last one."""

    rows: list[_Row]
    cache: Any
    attention: torch.Tensor

    def keep(self, indices: list[int]) -> None:
        """Drop every row whose index is not in ``indices``, then the leading positions that are padding in all rows.

        Without the trim, a batch that newcomers keep joining would carry the left padding of long-gone rows, and
        every step would attend over (and copy) a cache that only grows.
        """
        if len(indices) == len(self.rows):
            return
        index = torch.tensor(indices, dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.attention = self.attention[index]
        self.rows = [self.rows[i] for i in indices]
        layers = _cache_layers(self.cache)
        if not self.rows or not layers:
            return
        first = int(self.attention.any(dim=0).to(torch.int8).argmax())
        if first > 0:
            for layer in layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self.attention = self.attention[:, first:]

    def absorb(self, *others: _Batch) -> None:
        """Append the rows of ``others``, left-padding the shorter KV caches and masks so all line up on the right
        (one copy of each layer's keys/values however many batches join)."""
        joined = [self, *(other for other in others if other.rows)]
        if len(joined) == 1:
            return
        width = max(batch.attention.shape[1] for batch in joined)
        pads = [width - batch.attention.shape[1] for batch in joined]
        for layers in zip(*(_cache_layers(batch.cache) for batch in joined), strict=True):
            keys = torch.cat([_left_pad(layer.keys, pad) for layer, pad in zip(layers, pads, strict=True)])
            values = torch.cat([_left_pad(layer.values, pad) for layer, pad in zip(layers, pads, strict=True)])
            layers[0].keys, layers[0].values = keys, values
        self.attention = torch.cat([_left_pad(b.attention, pad, dim=1) for b, pad in zip(joined, pads, strict=True)])
        for batch in joined[1:]:
            self.rows += batch.rows


def decode_layout(replicas: int, threads: int | None) -> tuple[int, int]:
    """(replicas, intra-op threads of each) a policy server decodes with: ``threads`` None gives the replicas together
    half the usable cores, at least one thread each (never more than torch is set to use)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, not {replicas!r}")
    if threads is not None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        return replicas, threads
    return replicas, max(1, min(torch.get_num_threads(), usable_cores() // 2) // replicas)


class _Engine:
    """Owns the model; decodes batches of queued requests in one worker thread. See the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int,
        weights_version: str,
        threads: int,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    ) -> None:
        pin_mmap_threshold()  # a prefill's activations are freed as fast as a training step's
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.weights_version = weights_version
        self.threads = threads
        self._queue: queue.Queue[_GenerationRequest | _Swap | _AdapterLoad | _Forget | _Shutdown] = queue.Queue()
        self._carry: _Swap | _Shutdown | None = None
        # LoRA adapters: the PeftModel wrapping ``model`` once one is loaded; name -> (peft adapter key, version) of
        # the version new rows get; live rows per peft adapter key; superseded keys deleted once no row uses them.
        self._peft: Any = None
        self._adapters: dict[str, tuple[str, str]] = {}
        self._rows_on: dict[str, int] = {}
        self._retired: set[str] = set()
        self._loaded_adapters = 0
        # The plain model's parameter names, and where each lives once peft has wrapped some layers (base swaps).
        self.base_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        self._base_keys = {name: name for name in self.base_shapes}
        self._token_text = _TokenText(tokenizer)
        self._stop_ids = _stop_token_ids(model, tokenizer)
        # transformers 5 renamed ``past_key_values`` to ``cache`` (the old name warns); older releases only know it.
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._gate = threading.Event()
        self._gate.set()
        self._lock = threading.Lock()
        self._direct_swap_lock = threading.Lock()
        self._waiting = 0
        self._decoding = 0
        self._stats = ServerStats()
        self._prefixes = _PromptPrefixes(prefix_cache_bytes)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        torch.set_num_threads(self.threads)
        self._closing.clear()
        self._thread = threading.Thread(target=self._run, name="agl-policy-worker", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self) -> None:
        """Abort the running batch, fail every queued request (503), stop the worker and forget the remembered
        prompts (their keys and values serve only later requests)."""
        with self._lock:
            self._closing.set()
            self._queue.put(_SHUTDOWN)
        self._gate.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._carry is not None:
            self._reject(self._carry)
            self._carry = None
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._reject(item)
        self._prefixes.clear()

    # -- submission --------------------------------------------------------------------------------------------------

    def submit(self, request: _GenerationRequest) -> None:
        # Checked and enqueued under the lock that shutdown() takes, so nothing lands behind the shutdown marker.
        with self._lock:
            if self._closing.is_set() or not self.running:
                raise RuntimeError("the policy server is not running")
            self._waiting += 1
            self._queue.put(request)

    def swap(self, state_dict: Mapping[str, torch.Tensor], version: str, strict: bool, share: bool = False) -> None:
        """Install new weights between batches and block until done (directly when the worker is not running);
        ``share``: the model's parameters become these tensors (no copy)."""
        self._run_command(_Swap(state_dict, version, strict, share), self._apply_swap)

    def load_adapter(self, name: str, version: str, config: Any, weights: Mapping[str, torch.Tensor]) -> None:
        """Serve LoRA adapter ``name`` (peft ``LoraConfig`` and adapter state dict) as ``version`` for requests
        submitted from now on; block until done (directly when the worker is not running)."""
        self._run_command(_AdapterLoad(name, version, config, weights), self._apply_adapter)

    def forget_prompts(self) -> None:
        """Drop the remembered prompts' keys/values between decoding steps and block until done (directly when the
        worker is not running); rows decoding keep their own caches."""
        self._run_command(_Forget(), self._apply_forget)

    def _run_command(self, command: _WeightsCommand, apply: Callable[[_WeightsCommand], None]) -> None:
        """Hand a weights command to the worker and wait for it; raise what applying it raised."""
        self.post(command, apply)
        command.done.wait()
        if command.error is not None:
            raise command.error

    def post(self, command: _WeightsCommand, apply: Callable[[_WeightsCommand], None]) -> None:
        """Queue a weights command for the worker without waiting, or, when the worker is not running, ``apply`` it
        here; either way ``command.done`` is set once it is applied (or failed: ``command.error``)."""
        with self._lock:
            queued = self.running and not self._closing.is_set()
            if queued:
                self._queue.put(command)
        if not queued:
            with self._direct_swap_lock:
                apply(command)

    @property
    def adapters(self) -> dict[str, str]:
        """Each served LoRA adapter's name and the version new requests decode with."""
        with self._lock:
            return {name: version for name, (_, version) in self._adapters.items()}

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    @property
    def decoding(self) -> int:
        """Requests in the running batch that have not finished yet."""
        with self._lock:
            return self._decoding

    @property
    def load(self) -> int:
        """Requests queued or decoding: the work ahead of a request submitted now."""
        with self._lock:
            return self._waiting + self._decoding

    @property
    def stats(self) -> ServerStats:
        with self._lock:
            return self._stats

    @contextmanager
    def hold(self) -> Iterator[None]:
        self._gate.clear()
        try:
            yield
        finally:
            self._gate.set()

    # -- worker ------------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item: _GenerationRequest | _Swap | _AdapterLoad | _Forget | _Shutdown
            if self._carry is not None:
                item, self._carry = self._carry, None
            else:
                item = self._queue.get()
            if isinstance(item, _Shutdown):
                return
            if isinstance(item, _Swap):
                self._apply_swap(item)
                continue
            if isinstance(item, _AdapterLoad):
                self._apply_adapter(item)
                continue
            if isinstance(item, _Forget):
                self._apply_forget(item)
                continue
            self._gate.wait()
            batch = [item, *self._take_requests(self.max_batch_size - 1)]
            with self._lock:
                self._waiting -= 1
                self._stats = replace(self._stats, requests=self._stats.requests + 1, batches=self._stats.batches + 1)
            if self._closing.is_set():
                for request in batch:
                    self._reject(request)
                continue
            self._decode_safely(batch)

    def _take_requests(self, limit: int) -> list[_GenerationRequest]:
        """Up to ``limit`` requests from the front of the queue, stopping at a swap or shutdown (kept for ``_run``).

        An adapter load met on the way is applied at once: the rows already decoding keep the version they started
        on, and the requests behind it get the new one.
        """
        taken: list[_GenerationRequest] = []
        while len(taken) < limit and self._carry is None:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _GenerationRequest):
                taken.append(item)
            elif isinstance(item, _AdapterLoad):
                self._apply_adapter(item)
            elif isinstance(item, _Forget):
                self._apply_forget(item)
            else:
                self._carry = item
        if taken:
            with self._lock:
                self._waiting -= len(taken)
                self._stats = replace(self._stats, requests=self._stats.requests + len(taken))
        return taken

    def _reject(self, item: _GenerationRequest | _Swap | _AdapterLoad | _Forget | _Shutdown) -> None:
        if isinstance(item, _GenerationRequest):
            item.deliver(_Failed(503, "the policy server is shutting down"))
        elif isinstance(item, _Forget):  # shutting down forgets them anyway
            item.done.set()
        elif isinstance(item, _Swap | _AdapterLoad):
            item.error = RuntimeError("the policy server shut down before the weights were swapped")
            item.done.set()

    def _apply_swap(self, command: _Swap) -> None:
        try:
            self._prefixes.clear()  # first: a load that fails halfway has changed some weights already
            with torch.no_grad():
                if self._peft is None:
                    self.model.load_state_dict(command.state_dict, strict=command.strict, assign=command.share)
                else:  # peft moved each adapted layer's weights under ``base_layer``; its LoRA weights stay
                    missing = sorted(set(self._base_keys) - set(command.state_dict)) if command.strict else []
                    unknown = sorted(set(command.state_dict) - set(self._base_keys))
                    if missing or unknown:
                        raise ValueError(f"state_dict: missing keys {missing[:5]}, unknown keys {unknown[:5]}")
                    renamed = {self._base_keys[name]: tensor for name, tensor in command.state_dict.items()}
                    self.model.load_state_dict(renamed, strict=False, assign=command.share)
            self.weights_version = command.version
        except Exception as exc:  # reported to the caller of swap(), the worker keeps serving
            command.error = exc
        finally:
            command.done.set()

    def _apply_forget(self, command: _Forget) -> None:
        self._prefixes.clear()
        command.done.set()

    def _apply_adapter(self, command: _AdapterLoad) -> None:
        """Add the adapter's new version as a peft adapter of its own; the version it replaces is retired (deleted
        once no row decodes with it)."""
        from peft import PeftModel, set_peft_model_state_dict

        key = f"agl_adapter_{self._loaded_adapters}"  # never a substring of peft's "lora_" prefix
        self._loaded_adapters += 1
        try:
            if self._peft is None:
                self._peft = PeftModel(self.model, command.config, adapter_name=key)
                current = set(self.model.state_dict())
                self._base_keys = {
                    name: name if name in current else _under_base_layer(name) for name in self.base_shapes
                }
            else:
                self._peft.add_adapter(key, command.config)
            self._peft.eval()  # new LoRA modules start in training mode (dropout on)
            result = set_peft_model_state_dict(self._peft, dict(command.weights), adapter_name=key)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            missing = [name for name in getattr(result, "missing_keys", []) or [] if f".{key}." in name]
            if unexpected or missing:
                raise ValueError(
                    f"the adapter's weights do not fit its config on this model: unexpected keys {unexpected[:5]}, "
                    f"missing keys {missing[:5]}"
                )
        except Exception as exc:  # reported to the caller of load_adapter(), the worker keeps serving
            if self._peft is not None and key in self._peft.peft_config:
                self._delete_adapter(key)
            command.error = exc
            command.done.set()
            return
        with self._lock:
            previous = self._adapters.get(command.name)
            self._adapters[command.name] = (key, command.version)
        if previous is not None:
            self._retired.add(previous[0])
            self._collect_retired()
        command.done.set()

    def _collect_retired(self) -> None:
        """Delete the retired adapter versions no row decodes with any more (and their remembered prefixes)."""
        for key in [key for key in self._retired if not self._rows_on.get(key)]:
            self._retired.discard(key)
            self._prefixes.clear(key)
            self._delete_adapter(key)

    def _delete_adapter(self, key: str) -> None:
        with warnings.catch_warnings():  # "the active adapter was deleted": rows always name theirs
            warnings.simplefilter("ignore")
            self._peft.delete_adapter(key)

    def _forward(self, rows: list[_Row], **inputs: Any) -> Any:
        """The model's forward pass, each row with its own adapter once any adapter is served."""
        if self._peft is None:
            return self.model(**inputs)
        return self._peft(**inputs, adapter_names=[row.adapter_key for row in rows])

    def _decode_safely(self, requests: list[_GenerationRequest]) -> None:
        admitted: list[_Row] = []
        try:
            with torch.inference_mode():
                self._decode(requests, admitted)
        except Exception as exc:  # one bad batch must not take the server down
            for row in admitted:
                row.end(_Failed(500, f"generation failed: {type(exc).__name__}: {exc}"))

    def _decode_text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _admit(self, requests: list[_GenerationRequest], admitted: list[_Row]) -> list[_Row]:
        """Rows for the requests whose clients still wait, told which weights they decode on."""
        rows: list[_Row] = []
        for request in requests:
            if request.cancelled.is_set():
                continue
            key, version = BASE, self.weights_version
            if request.adapter is not None:
                key, version = self._adapters[request.adapter]
            rows.append(_Row(request, self._decode_text, functools.partial(self._row_ended, key), key, version))
        with self._lock:
            for row in rows:
                self._rows_on[row.adapter_key] = self._rows_on.get(row.adapter_key, 0) + 1
            self._decoding += len(rows)
            self._stats = replace(
                self._stats,
                abandoned=self._stats.abandoned + len(requests) - len(rows),
                max_batch_size_seen=max(self._stats.max_batch_size_seen, self._decoding),
            )
        for row in rows:
            admitted.append(row)
            row.request.deliver(_Started(row.version))
        return rows

    def _decode(self, requests: list[_GenerationRequest], admitted: list[_Row]) -> None:
        """Decode until no row is left, letting queued requests join between steps while the batch has room."""
        batch = self._prefill(self._admit(requests, admitted))
        joinable = batch is not None and bool(_cache_layers(batch.cache))
        while batch is not None and batch.rows:
            if self._closing.is_set():
                for row in batch.rows:
                    row.end(_Failed(503, "the policy server is shutting down"))
                return
            room = self.max_batch_size - len(batch.rows)
            if joinable and room > 0 and self._gate.is_set():
                joining = self._prefill(self._admit(self._take_requests(room), admitted))
                if joining is not None and joining.rows:
                    batch.absorb(joining)
            for row in batch.rows:
                row.position += 1
            batch.attention = torch.cat([batch.attention, batch.attention.new_ones((len(batch.rows), 1))], dim=1)
            output = self._forward(
                batch.rows,
                input_ids=torch.tensor([[row.last_token] for row in batch.rows], dtype=torch.long),
                attention_mask=batch.attention,
                position_ids=torch.tensor([[row.position] for row in batch.rows], dtype=torch.long),
                use_cache=True,
                **{self._cache_kwarg: batch.cache},
            )
            batch.keep(self._step(batch.rows, output.logits[:, -1, :].float()))
            if self._retired:
                self._collect_retired()

    def _prefill(self, rows: list[_Row]) -> _Batch | None:
        """Prefill ``rows`` one prompt per forward pass, in order, and sample each row's first token. A row whose
        prompt starts with a remembered prompt prefix of at least ``MIN_REUSED_PREFIX`` tokens runs only the rest of
        its prompt, and each prefilled prompt is remembered before the next row looks: a group's copies of one prompt
        and questions on one schema compute their shared beginning once, even when they arrive together.

        One prompt per pass also bounds a prefill's activations by the longest prompt instead of the batch (a
        left-padded pass holds every row's attention scores at once), and a prompt of hundreds of tokens fills a CPU's
        matrix units alone."""
        if not rows:
            return None
        parts: list[_Batch] = []
        hits = 0
        for row in rows:
            reused = self._prefixes.longest(row.adapter_key, row.request.prompt_ids)
            hits += reused is not None
            parts.append(self._prefill_row(row, *(reused or ())))
        with self._lock:
            self._stats = replace(
                self._stats,
                prompt_tokens=self._stats.prompt_tokens + sum(len(row.request.prompt_ids) for row in rows),
                prefix_hits=self._stats.prefix_hits + hits,
                prefix_misses=self._stats.prefix_misses + len(rows) - hits,
            )
        batch = next((part for part in parts if part.rows), parts[0])
        batch.absorb(*(part for part in parts if part is not batch))
        return batch

    def _prefill_row(
        self, row: _Row, length: int = 0, prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> _Batch:
        """Prefill one row, remember its prompt's keys/values and sample its first token; with a remembered
        ``prefix`` (keys/values of at least its first ``length`` prompt tokens) only the rest of the prompt runs."""
        prompt = row.request.prompt_ids
        cache = _new_cache(self.model)
        for index, (keys, values) in enumerate(prefix or []):
            cache.update(keys[:, :, :length], values[:, :, :length], index)
        attention = torch.ones((1, len(prompt)), dtype=torch.long)
        output = self._forward(
            [row],
            input_ids=torch.tensor([prompt[length:]], dtype=torch.long),
            attention_mask=attention,
            position_ids=torch.arange(length, len(prompt), dtype=torch.long).unsqueeze(0),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        self._prefixes.remember(row.adapter_key, prompt, [(layer.keys, layer.values) for layer in _cache_layers(cache)])
        if length:
            with self._lock:
                self._stats = replace(self._stats, reused_prompt_tokens=self._stats.reused_prompt_tokens + length)
        batch = _Batch([row], cache, attention)
        batch.keep(self._step([row], output.logits[:, -1, :].float()))
        return batch

    def _step(self, rows: list[_Row], logits: torch.Tensor) -> list[int]:
        """Sample one token for every row; returns the indices of the rows that go on decoding."""
        tokens = self._sample(rows, logits)
        logprobs = _sampling_log_softmax(rows, logits) if any(row.params.logprobs for row in rows) else None
        keep: list[int] = []
        abandoned = 0
        for i, row in enumerate(rows):
            entry = self._logprob_entry(row, logprobs[i], tokens[i]) if logprobs is not None else None
            if row.add(tokens[i], entry, self._stop_ids):
                continue
            if row.request.cancelled.is_set():
                row.end(None)
                abandoned += 1
            else:
                keep.append(i)
        with self._lock:
            self._stats = replace(
                self._stats,
                generated_tokens=self._stats.generated_tokens + len(rows),
                abandoned=self._stats.abandoned + abandoned,
            )
        return keep

    def _row_ended(self, adapter_key: str) -> None:
        with self._lock:
            self._decoding -= 1
            self._rows_on[adapter_key] -= 1

    @staticmethod
    def _sample(rows: list[_Row], logits: torch.Tensor) -> list[int]:
        if all(row.generator is None for row in rows):
            return [int(t) for t in torch.argmax(logits, dim=-1).tolist()]
        tokens: list[int] = []
        for i, row in enumerate(rows):
            params = row.params
            if params.temperature == 0 or row.generator is None:
                tokens.append(int(torch.argmax(logits[i]).item()))
                continue
            probs = torch.softmax(logits[i] / params.temperature, dim=-1)
            if params.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                outside = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
                outside[0] = False  # the most likely token always stays (top_p=0 means greedy)
                sorted_probs[outside] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            tokens.append(_draw(probs, row.generator))
        return tokens

    def _logprob_entry(self, row: _Row, logprobs: torch.Tensor, token_id: int) -> dict[str, Any] | None:
        """The OpenAI logprob entry of the sampled token; ``logprobs`` is the row's log-softmax at its sampling
        temperature (``_sampling_log_softmax``)."""
        if not row.params.logprobs:
            return None
        entry = self._token_text.entry(token_id, float(logprobs[token_id].item()))
        top: list[dict[str, Any]] = []
        if row.params.top_logprobs > 0:
            values, ids = torch.topk(logprobs, row.params.top_logprobs)
            top = [self._token_text.entry(int(t), float(v)) for v, t in zip(values.tolist(), ids.tolist(), strict=True)]
        entry["top_logprobs"] = top
        return entry


#: Tokens per block of ``_draw``'s two-level race (about the square root of a 150k vocabulary).
_RACE_BLOCK = 512


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from ``probs`` by an exponential race in two levels: first among blocks of ``_RACE_BLOCK``
    consecutive tokens weighted by their mass, then among the winning block's tokens.

    The race (the winner is the largest ``weight / E`` with ``E`` an exponential draw per entrant, as in
    ``torch.multinomial`` and vLLM's sampler) draws each entrant with probability proportional to its weight, and the
    two levels keep that exact: the winning block is drawn by its mass, its winner by its share of it. Its answer
    changes only where two entrants' ratios tie to within the logits' rounding, so a row batched with others (whose
    logits differ from its solo run's in the last bits) draws the same tokens from the same seed; inverting the
    cumulative distribution flipped a token whenever rounding moved a boundary past the uniform draw, which on a
    large flat vocabulary happens every few hundred steps. Two levels draw ~800 exponentials instead of one per token
    (152k on Qwen's vocabulary: 0.8 ms a row on one CPU thread), which costs what the cumulative sum did; a token of
    probability 0 never wins against one above 0.
    """
    vocab = probs.shape[-1]
    blocks = -(-vocab // _RACE_BLOCK)
    padded = torch.nn.functional.pad(probs.to(torch.float64), (0, blocks * _RACE_BLOCK - vocab)).view(blocks, -1)
    block = _race(padded.sum(dim=1), generator)
    return block * _RACE_BLOCK + _race(padded[block], generator)


def _race(weights: torch.Tensor, generator: torch.Generator) -> int:
    """The index of the largest ``weight / E``, one exponential ``E = -log U`` per entrant (float64, drawn from
    ``generator``): index ``i`` wins with probability ``weights[i] / weights.sum()``."""
    exponentials = torch.rand(weights.shape, generator=generator, dtype=torch.float64).log_().neg_()
    return int(torch.argmax(weights / exponentials).item())


def _sampling_log_softmax(rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
    """Each row's log-probabilities under the distribution it samples from: its logits divided by its temperature
    (1 for a greedy row), so a trainer that recomputes them at the call's temperature gets an importance ratio of 1."""
    scale = torch.tensor([[logprob_temperature(row.params.temperature)] for row in rows], dtype=logits.dtype)
    return torch.log_softmax(logits / scale, dim=-1)


def _under_base_layer(name: str) -> str:
    """Where peft keeps a wrapped layer's own parameter: ``a.q_proj.weight`` -> ``a.q_proj.base_layer.weight``."""
    module, _, parameter = name.rpartition(".")
    return f"{module}.base_layer.{parameter}"


def _stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-turn ids: the generation config's and tokenizer's EOS, plus ChatML's ``<|im_end|>`` when in the vocab."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return frozenset(ids)
