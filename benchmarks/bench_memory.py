"""Where a command's memory goes: the proportional set size (PSS) of its whole process tree, by phase and by process.

    .venv/bin/python -m benchmarks.bench_memory                          # the main job: bash scripts/demo.sh
    .venv/bin/python -m benchmarks.bench_memory --json runs/mem.json -- bash scripts/demo.sh --quick

Runs the command (its output passes through), samples every process it started every ``--interval`` seconds from
``/proc/<pid>/smaps_rollup``, and prints, per phase, its duration and the peak of the PSS summed over the tree with
that moment's largest processes. PSS splits shared pages among the processes that map them, so the sum is what the
tree costs the machine (a resident-set sum counts shared libraries and shared weights once per process); the page
cache of files read is not counted.

The phases are read from the demo's own output: ``[demo] evaluating …`` starts an evaluation, ``[demo] warm start``
the supervised warm start, ``[demo] rejection sampling`` RFT, ``[demo] SFT control`` a matched control, an ``rl round``
progress bar LightningRL's rollouts and its completed bar the update (until the round's ``[agl] step`` line). A
command that prints none of these is one phase, ``start``. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agl.cpu import cpu_description

#: (pattern over one output line, the phase it starts), first match wins.
PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\[demo\] evaluating"), "evaluation"),
    (re.compile(r"^\[demo\] warm start"), "warm start"),
    (re.compile(r"^\[demo\] rejection sampling"), "rft"),
    (re.compile(r"^\[demo\] SFT control"), "sft control"),
    (re.compile(r"^LightningRL:"), "rl (start)"),
    (re.compile(r"^\[agl\] step \d+"), "rl (between rounds)"),
    (re.compile(r"^rl round \d+/\d+:\s+100%"), "rl update"),
    (re.compile(r"^rl round \d+/\d+:"), "rl rollouts"),
)
GIB = 1024**3


@dataclass
class Phase:
    """One phase's samples: its wall time and the largest tree-wide PSS seen, with that sample's processes."""

    name: str
    seconds: float = 0.0
    peak: int = 0
    processes: dict[str, int] = field(default_factory=dict)


def tree(root: int) -> Iterator[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    todo = [root]
    while todo:
        pid = todo.pop()
        yield pid
        todo.extend(children.get(pid, []))


def pss(pid: int) -> int:
    """The process's proportional set size in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def role(pid: int) -> str:
    """A short name for what the process runs: ``python -m X`` → X, a multiprocessing helper by its module."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    argv = [a for a in argv if a]
    if not argv:
        return "?"
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    if "-c" in argv[:-1]:
        code = argv[argv.index("-c") + 1]
        match = re.search(r"from ([\w.]+) import", code)
        return match.group(1) if match else "python -c"
    return " ".join(Path(a).name for a in argv[:2])


class Sampler:
    """Samples the tree below ``root`` until stopped, charging each sample to the phase current at the time."""

    def __init__(self, root: int, interval: float) -> None:
        self.root, self.interval = root, interval
        self.phase = "start"
        self.phases: dict[str, Phase] = {}
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            by_role: dict[str, int] = {}
            pids = list(tree(self.root))
            for pid in pids:
                size = pss(pid)
                if size:
                    name = role(pid)
                    by_role[name] = by_role.get(name, 0) + size
            now = time.monotonic()
            phase = self.phases.setdefault(self.phase, Phase(self.phase))
            phase.seconds += now - last
            last = now
            self.peak_processes = max(self.peak_processes, len(pids))
            total = sum(by_role.values())
            if total > phase.peak:
                phase.peak, phase.processes = total, by_role
            self._stop.wait(self.interval)


def follow(proc: subprocess.Popen[bytes], sampler: Sampler) -> None:
    """Pass the command's output through, switching the sampler's phase on the lines that start one."""
    assert proc.stdout is not None
    pending = b""
    while chunk := os.read(proc.stdout.fileno(), 65536):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        for raw in lines:
            line = raw.decode(errors="replace").strip()
            for pattern, phase in PHASES:
                if pattern.search(line):
                    sampler.phase = phase
                    break


def report(phases: dict[str, Phase], wall: float, rc: int, processes: int) -> list[str]:
    rows = [f"cpu: {cpu_description()}; wall {wall / 60:.1f} min, rc {rc}, up to {processes} processes"]
    rows.append(f"{'phase':<22} {'minutes':>8} {'peak PSS GiB':>13}  largest processes at the peak")
    for p in phases.values():
        top = sorted(p.processes.items(), key=lambda kv: -kv[1])[:4]
        shown = ", ".join(f"{name} {size / GIB:.2f}" for name, size in top)
        rows.append(f"{p.name:<22} {p.seconds / 60:>8.1f} {p.peak / GIB:>13.2f}  {shown}")
    overall = max((p.peak for p in phases.values()), default=0)
    rows.append(f"peak of the whole run: {overall / GIB:.2f} GiB (PSS summed over the process tree)")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--json", type=Path, help="also write the phases as JSON here")
    p.add_argument("command", nargs="*", help="the command (after --); default: bash scripts/demo.sh")
    args = p.parse_args()
    command = args.command or ["bash", "scripts/demo.sh"]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sampler = Sampler(proc.pid, args.interval).start()
    try:
        follow(proc, sampler)
        rc = proc.wait()
    finally:
        sampler.stop()
    rows = report(sampler.phases, time.monotonic() - started, rc, sampler.peak_processes)
    print("\n[bench_memory] " + "\n[bench_memory] ".join(rows), flush=True)
    if args.json is not None:
        payload = {
            "command": command,
            "cpu": cpu_description(),
            "rc": rc,
            "phases": [
                {"phase": ph.name, "seconds": ph.seconds, "peak_bytes": ph.peak, "processes": ph.processes}
                for ph in sampler.phases.values()
            ],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    sys.exit(rc)


if __name__ == "__main__":
    main()
