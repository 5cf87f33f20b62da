"""``agl`` command line: run the server, run runners, list rollouts, show one rollout's span tree and transitions."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from collections.abc import Sequence
from typing import Any

from agl.core.jsonsafe import one_line

DEFAULT_STORE = "sqlite:///runs/agl.db"


def _fmt_time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=False)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return int(text)


ALLOW_HOST_HELP = (
    "a Host header name the server answers to besides localhost, 127.0.0.1 and [::1] (e.g. behind a local proxy); "
    "repeatable. On loopback every other name is refused, so that a web page cannot reach the server by pointing its "
    "own domain at 127.0.0.1 (DNS rebinding)"
)


def cmd_server(args: argparse.Namespace) -> int:
    """Serve until interrupted; 2 when the tokens cannot be read or an open server would listen beyond loopback."""
    from agl.core.net import is_loopback
    from agl.core.server import serve
    from agl.core.server.auth import Tokens, check_bind
    from agl.core.server.backends import AllowedBackends
    from agl.core.types import ENV_TOKEN
    from agl.dashboard import add_dashboard

    try:
        tokens = Tokens.configured(args.token_file)
        if tokens is not None and args.no_token:
            raise ValueError(f"--no-token, but tokens are given (--token-file or {ENV_TOKEN}): give one or the other")
        if args.rotate_token and (tokens is not None or args.no_token):
            raise ValueError(
                f"--rotate-token makes a new token for the store of a server without tokens of its own; with "
                f"--token-file, {ENV_TOKEN} or --no-token there is none to rotate (edit the token file instead)"
            )
        check_bind(args.host, tokens)
        AllowedBackends(args.allow_backend or [])  # a bad pattern is refused here, naming it
        if args.allow_backend and args.allow_any_backend:
            raise ValueError("--allow-backend and --allow-any-backend contradict each other: give one")
        if not is_loopback(args.host) and not args.allow_backend and not args.allow_any_backend:
            raise ValueError(
                f"listening on {args.host}, the gateway would fetch any URL a trainer publishes, hosts only this "
                "machine can reach included: name the LLM backends with --allow-backend PATTERN (e.g. "
                "'http://10.0.0.*:8000/v1'), or accept that with --allow-any-backend"
            )
    except ValueError as exc:  # TokenFileError too
        print(f"agl server: {exc}", file=sys.stderr)
        return 2
    exporter = _live_exporter(args.store, args.otlp)
    try:
        serve(
            args.store,
            args.host,
            args.port,
            tokens,
            gateway_timeout=args.gateway_timeout,
            allow_backends=args.allow_backend,
            gateway_max_response_bytes=args.gateway_max_response_bytes,
            allow_hosts=args.allow_host or (),
            local_token=not args.no_token,
            rotate_token=args.rotate_token,
            pages=add_dashboard,
        )
    except PermissionError as exc:  # the store's token file is open to others
        print(f"agl server: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # uvicorn stops gracefully on Ctrl-C, then raises it again
        print("agl server: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    finally:
        if exporter is not None:
            exporter.close()
    return 0


def cmd_runner(args: argparse.Namespace) -> int:
    """Keep ``-n`` runner processes working for a server; exit 0 on Ctrl-C / SIGTERM, 1 when they cannot be kept up."""
    import signal
    import threading

    from agl.core.integration_scopes import resolve_integrations
    from agl.core.runner import load_agent
    from agl.core.runner_pool import RunnerPool, RunnerPoolError
    from agl.core.telemetry import quiet_framework_telemetry

    if args.n < 1:
        print(f"agl runner: -n must be at least 1, got {args.n}", file=sys.stderr)
        return 2
    try:
        integrations = resolve_integrations(args.integration)
    except ValueError as exc:
        print(f"agl runner: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_framework_telemetry()  # before the agent's module imports its framework, here and in the workers
    load_agent(args.agent)
    stopping = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stopping.set())
    pool = RunnerPool(
        args.agent,
        args.server,
        args.n,
        name="cli-runner",
        retry_for=args.retry_for,
        log_level=logging.INFO,
        daemon=False,
        integrations=integrations,
    )
    try:
        pool.start()
        print(f"agl: {args.n} runner(s) working for {args.server}; Ctrl-C to stop", file=sys.stderr)
        while not stopping.wait(0.5):
            pool.check()
    except RunnerPoolError as exc:
        print(f"agl runner: {exc}", file=sys.stderr)
        return 1
    finally:
        pool.stop(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from agl.core.store import open_store

    store = open_store(args.store)
    if args.failures:
        return _print_failures(store)
    rollouts = store.list_rollouts(status=args.status, mode=args.mode, limit=args.limit)
    if not rollouts:
        print("no rollouts" + (f" with status {args.status}" if args.status else ""))
        return 0
    rows = [
        [
            r.rollout_id,
            r.status,
            r.mode,
            r.task_id or "-",
            "-" if r.final_reward is None else f"{r.final_reward:.3f}",
            str(r.attempts),
            f"v{r.resources_version}",
            _fmt_time(r.created_at),
            one_line(r.error or "", 50),
        ]
        for r in rollouts
    ]
    print(_table(rows, ["ROLLOUT", "STATUS", "MODE", "TASK", "REWARD", "TRIES", "RES", "CREATED", "ERROR"]))
    return 0


def _print_failures(store: Any) -> int:
    """``agl runs --failures``: counts per failure kind and per round (resources version), one example per kind."""
    from agl.core.failures import FAILURE_KINDS, failure_breakdown

    found = failure_breakdown(store)
    print(f"{found.rollouts} finished rollout(s), {sum(found.counts.values())} failed")
    if not found.counts:
        return 0
    rows = [[kind, str(found.counts[kind])] for kind in FAILURE_KINDS if found.counts[kind]]
    print(_table(rows, ["FAILURE", "COUNT"]))
    print("\nper round (resources version):")
    rounds = [
        [f"v{v}", str(r.rollouts), f"{r.rate:.0%}", ", ".join(f"{k}={n}" for k, n in sorted(r.counts.items()))]
        for v, r in sorted(found.rounds.items())
    ]
    print(_table(rounds, ["ROUND", "ROLLOUTS", "FAILED", "KINDS"]))
    print("\nexamples:")
    for kind in FAILURE_KINDS:
        ex = found.examples.get(kind)
        if ex is not None:
            status = f" (HTTP {ex.status})" if ex.status is not None else ""
            print(f"  {kind}{status}: {ex.rollout_id}  {one_line(ex.detail, 90)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from agl.core.adapter import build_trajectory, select_agents
    from agl.core.store import NotFound, open_store

    store = open_store(args.store)
    try:
        ro = store.get_rollout(args.rollout)
    except NotFound as exc:
        print(f"agl show: {exc}", file=sys.stderr)
        return 1
    reward = "-" if ro.final_reward is None else f"{ro.final_reward:.4g}"
    print(
        f"rollout {ro.rollout_id}  status={ro.status}  reward={reward}  task={ro.task_id}  "
        f"resources=v{ro.resources_version}"
    )
    print(f"task: {one_line(ro.task, 110)}")
    if ro.error:
        print(f"ERROR: {ro.error}")
    attempts = store.list_attempts(ro.rollout_id)
    for a in attempts:
        took = f"{(a.ended_at or a.heartbeat_at) - a.started_at:.2f}s"
        print(f"  attempt {a.number} {a.attempt_id} worker={a.worker_id} {a.status} {took} {a.error or ''}".rstrip())
    final = next(
        (a for a in reversed(attempts) if a.status in ("succeeded", "failed")), attempts[-1] if attempts else None
    )
    if final is None:
        return 0
    spans = store.query_spans(attempt_id=final.attempt_id)
    print(f"\nspans of attempt {final.number} ({len(spans)}):")
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Any]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            took = f"{(s.end_time - s.start_time) * 1000:.0f}ms" if s.end_time else ""
            who = f" [{s.agent}]" if s.agent else ""
            mark = " ERROR" if s.status == "error" else ""
            print(f"  {'  ' * depth}{s.kind}:{s.name}{who} {took}{mark}  {_describe(s)}".rstrip())
            walk(s.span_id, depth + 1)

    walk(None, 0)
    traj = build_trajectory(ro, spans, select_agents(args.agents), final.attempt_id)
    print(f"\ntransitions ({len(traj.transitions)}):")
    for t in traj.transitions:
        print(
            f"  #{t.step} [{t.agent or '-'}] prompt_ids={len(t.prompt_ids)} response_ids={len(t.response_ids)} "
            f"reward={t.reward:.3g}  {one_line(t.response_message.get('content') or t.response_message, 60)}"
        )
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard alone over a store until interrupted; 2 when asked to listen beyond loopback (it has no
    tokens: serve it with ``agl server --token-file`` there)."""
    import uvicorn

    from agl.core.net import is_loopback
    from agl.core.store import open_store
    from agl.dashboard import create_dashboard_app

    if not is_loopback(args.host):
        print(
            f"agl dashboard: refusing to listen on {args.host}: it has no tokens, so anyone who can reach it could "
            "read every rollout. Listen on 127.0.0.1 (reading a remote store with --store http://HOST:4747 and "
            "AGL_TOKEN), or serve the pages with `agl server --token-file FILE` (at /)",
            file=sys.stderr,
        )
        return 2
    store = open_store(args.store)
    print(f"agl dashboard on http://{args.host}:{args.port}/ (read-only)", file=sys.stderr, flush=True)
    try:
        app = create_dashboard_app(store, host_names=args.allow_host or [])
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        store.close()
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Copy a store into an empty PostgreSQL database; 1 when refused (the message says why)."""
    from agl.core.net import shown_url
    from agl.core.store import StoreError
    from agl.core.store.migrate import copy_store

    try:
        copied = copy_store(args.source, args.target, progress=lambda line: print(f"agl migrate: {line}", flush=True))
    except StoreError as exc:  # StoreUnavailable too: the message names the database and the reason
        print(exc if str(exc).startswith("agl migrate") else f"agl migrate: {exc}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {table}" for table, n in copied.items())
    print(f"agl migrate: copied {counts} from {shown_url(args.source)} to {shown_url(args.target)}")
    return 0


def _describe(span: Any) -> str:
    from agl.core.adapter import span_summary
    from agl.core.types import ATTR_RESPONSE_IDS

    if span.kind == "llm":
        return f"ids={len(span.attributes.get(ATTR_RESPONSE_IDS) or [])} {span_summary(span, 70)}"
    return span_summary(span, 90)


# ---------------------------------------------------------------------------------------- OpenTelemetry (agl.otel)


def cmd_export(args: argparse.Namespace) -> int:
    """Export finished rollouts as OTLP traces; 1 when the receiver refused them or a rollout is unknown."""
    from agl.core.store import NotFound, open_store
    from agl.otel.export import ExportFailed, export_spans

    if args.otlp is None and args.file is None:
        print("agl export: give --otlp URL and/or --file PATH", file=sys.stderr)
        return 2
    store = open_store(args.store)
    try:
        report = export_spans(
            store,
            args.otlp,
            file=args.file,
            rollout_ids=args.rollout,
            status=args.status,
            mode=args.mode,
            limit=args.limit,
        )
    except (ExportFailed, NotFound) as exc:
        print(f"agl export: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"exported {report.rollouts} rollouts: {report.traces} traces, {report.spans} spans")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import traces recorded without agl as rollouts; 1 when the source or the store refused."""
    from agl.core.net import shown_url
    from agl.core.store import StoreError, open_store
    from agl.otel.importer import import_traces, read_mlflow, read_otlp_json, read_phoenix

    try:
        if args.otlp_file is not None:
            spans, source = read_otlp_json(args.otlp_file), f"file:{args.otlp_file}"
        elif args.from_mlflow is not None:
            spans, source = read_mlflow(args.from_mlflow, args.experiment), f"mlflow:{shown_url(args.from_mlflow)}"
        else:
            spans, source = read_phoenix(args.from_phoenix, args.project), f"phoenix:{args.from_phoenix}"
        store = open_store(args.store)
        try:
            report = import_traces(store, spans, source, reward=args.reward)
        finally:
            store.close()  # a SQLite file checkpointed, a PostgreSQL pool closed
    except (ValueError, OSError, ImportError, StoreError) as exc:
        print(f"agl import: {exc}", file=sys.stderr)
        return 1
    print(f"imported {report.rollouts} rollouts ({report.spans} spans); {report.skipped} already in the store")
    return 0


def _live_exporter(store: str, otlp: str | None) -> Any:
    """``agl server --otlp``: a ``LiveExporter`` following the served store (None without ``--otlp``)."""
    if otlp is None:
        return None
    from agl.core.store import open_store
    from agl.otel.export import LiveExporter

    return LiveExporter(open_store(store), otlp).start()


def _otel_parsers(sub: Any) -> None:
    ex = sub.add_parser("export", help="export finished rollouts as OpenTelemetry traces (OTLP/HTTP or a JSON file)")
    ex.add_argument("--store", default=DEFAULT_STORE)
    ex.add_argument("--otlp", metavar="URL", help="OTLP/HTTP receiver, e.g. http://127.0.0.1:6006 (/v1/traces added)")
    ex.add_argument("--file", metavar="PATH", help="write the traces as one OTLP JSON document")
    ex.add_argument("--rollout", action="append", metavar="ID", help="export this rollout (repeatable)")
    ex.add_argument("--status", choices=["succeeded", "failed", "cancelled"])
    ex.add_argument("--mode", choices=["train", "val", "test"])
    ex.add_argument("--limit", type=_positive_int, help="at most this many rollouts, newest first")
    ex.set_defaults(fn=cmd_export)
    im = sub.add_parser(
        "import",
        help="import OpenInference / GenAI traces recorded without agl as rollouts",
        description="Import traces recorded without agl as finished rollouts. Import into a store no runner is "
        "attached to: the importer enqueues each trace as a rollout and leases it itself to store its spans, so an "
        "idle runner of the same store (agl runner, a Trainer's runners) can lease an imported rollout first and run "
        "the agent on its input. It refuses a store with queued rollouts, but cannot see idle runners.",
    )
    source = im.add_mutually_exclusive_group(required=True)
    source.add_argument("--otlp-file", metavar="PATH", help="OTLP JSON (one document, or one per line)")
    source.add_argument("--from-phoenix", metavar="URL", help="a Phoenix server, e.g. http://127.0.0.1:6006")
    source.add_argument(
        "--from-mlflow", metavar="URI", help="an MLflow tracking store, e.g. sqlite:///mlflow.db or http://host:5000"
    )
    im.add_argument("--project", default="default", help="the Phoenix project to read (default 'default')")
    im.add_argument("--experiment", metavar="NAME", help="the MLflow experiment to read (default: every one)")
    im.add_argument(
        "--reward",
        metavar="NAME",
        help="the annotation (MLflow: feedback) whose score is a trace's final reward (default: the only one)",
    )
    im.add_argument("--store", default=DEFAULT_STORE)
    im.set_defaults(fn=cmd_import)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agl",
        description="Train LLM agents from what they do.",
        epilog="Commands that talk to an agl server send the token in the AGL_TOKEN environment variable.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("server", help="serve a store over HTTP with the LLM gateway")
    s.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=4747)
    s.add_argument(
        "--token-file",
        metavar="FILE",
        help="bearer tokens the server accepts, one '<role> <token>' per line (roles: trainer, runner, reader; "
        "# comments); AGL_TOKEN adds a trainer token. Without any, the server listens only on loopback with a "
        "trainer token of its store, made once for this user and kept across restarts in a file only the user can "
        "read, which agl's clients on this machine use",
    )
    s.add_argument(
        "--no-token",
        action="store_true",
        help="without --token-file or AGL_TOKEN: serve open, with no token at all (every process of this machine may "
        "then use the server and its LLM keys)",
    )
    s.add_argument(
        "--rotate-token",
        action="store_true",
        help="without --token-file or AGL_TOKEN: make a new token for this store instead of the one kept for it; the "
        "old token, and the attempt keys signed with it, stop working (agl's clients on this machine started after "
        "this use the new one)",
    )
    s.add_argument("--allow-host", action="append", metavar="NAME", help=ALLOW_HOST_HELP)
    s.add_argument(
        "--allow-backend",
        action="append",
        metavar="PATTERN",
        help="an LLM backend the gateway may call, as scheme://host[:port][/path] with fnmatch wildcards matched per "
        "part, a host's within one label (e.g. https://api.openai.com/v1, http://10.0.0.*:8000); repeatable. When "
        "given, LLM resources with any other base_url are refused at publish and call time. On loopback the default "
        "is any backend; beyond loopback give the backends, or --allow-any-backend",
    )
    s.add_argument(
        "--allow-any-backend",
        action="store_true",
        help="beyond loopback: let trainers point the gateway at any URL (the server can then be made to fetch from "
        "hosts only it can reach); without this, --allow-backend is required there",
    )
    s.add_argument(
        "--gateway-timeout",
        type=_positive,
        default=600.0,
        metavar="SECONDS",
        help="how long the gateway waits for an LLM backend: a whole non-streaming call, each read of a stream "
        "(default 600)",
    )
    s.add_argument(
        "--gateway-max-response-bytes",
        type=_positive_int,
        default=32 * 2**20,
        metavar="BYTES",
        help="the largest LLM backend answer the gateway relays (a whole body, or a stream in all; default 32 MiB)",
    )
    s.add_argument(
        "--otlp",
        metavar="URL",
        help="also export each rollout, once finished, to this OTLP/HTTP receiver (e.g. http://127.0.0.1:6006)",
    )
    s.set_defaults(fn=cmd_server)

    r = sub.add_parser("runner", help="run rollouts from a server with an agent function")
    r.add_argument("--server", required=True, help="agl server URL, e.g. http://127.0.0.1:4747")
    r.add_argument("--agent", required=True, help="the agent as module:function")
    r.add_argument("-n", type=int, default=1, help="runner processes (default 1)")
    r.add_argument(
        "--integration",
        action="append",
        metavar="NAME",
        help="a framework integration to enter in every rollout (crewai, autogen, openai_agents, langchain); "
        "repeatable. Needed only for a framework the agent imports inside its own code: by default a runner enters "
        "those of the frameworks the agent's module imports. Frameworks' own telemetry is off in runners unless "
        "AGL_KEEP_FRAMEWORK_TELEMETRY=1",
    )
    r.add_argument(
        "--retry-for",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long runners keep retrying a server that is unreachable or failing before giving up (default 60)",
    )
    r.set_defaults(fn=cmd_runner)

    ls = sub.add_parser("runs", help="list rollouts, newest first")
    ls.add_argument("--store", default=DEFAULT_STORE)
    ls.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    ls.add_argument("--mode", choices=["train", "val", "test"])
    ls.add_argument("--limit", type=int, default=30)
    ls.add_argument(
        "--failures", action="store_true", help="count failures by kind and round, with one example per kind"
    )
    ls.set_defaults(fn=cmd_runs)

    sh = sub.add_parser("show", help="one rollout: attempts, span tree, transitions")
    sh.add_argument("rollout")
    sh.add_argument("--store", default=DEFAULT_STORE)
    sh.add_argument("--agents", default=None, help="regex of agents whose calls are transitions (default all)")
    sh.set_defaults(fn=cmd_show)

    db = sub.add_parser("dashboard", help="serve the read-only dashboard (runs, rollouts, curves) over a store")
    db.add_argument("--store", default=DEFAULT_STORE, help="store URL: sqlite:///..., postgresql://..., http://...")
    db.add_argument("--host", default="127.0.0.1", help="loopback only (agl server serves it with tokens)")
    db.add_argument("--port", type=int, default=4848)
    db.add_argument("--allow-host", action="append", metavar="NAME", help=ALLOW_HOST_HELP)
    db.set_defaults(fn=cmd_dashboard)

    mg = sub.add_parser(
        "migrate",
        help="copy a store into an empty PostgreSQL database",
        description="Copy every rollout, attempt, span, resources version (with its real API keys) and record of a "
        "store into an empty PostgreSQL database, in one transaction: an interrupted copy leaves the target empty. "
        "A target that already holds agl data is refused (there is no --force: merging two stores would renumber "
        "resources versions); create a new database instead. Stop the servers writing to the source first: what "
        "they write during the copy is not copied.",
    )
    mg.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the store to copy: sqlite:///path.db or postgresql://...",
    )
    mg.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="an empty PostgreSQL database: postgresql://user:pw@host/db",
    )
    mg.set_defaults(fn=cmd_migrate)
    _otel_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
