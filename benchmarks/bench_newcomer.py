"""Time a newcomer's first five minutes as the README writes them: its install lines, then its quickstart, run in a
fresh clone of this repository, each line timed.

    .venv/bin/python -m benchmarks.bench_newcomer [--keep]

The lines are read from README.md itself (the ``bash`` blocks under "Install" and "Quickstart"), with
``<this repository>`` replaced by this clone, so the figure is for what the README says, not a copy of it. pip's own
cache is used as it is (say whether it was warm when quoting the figure); nothing else is shared with this tree.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_lines(readme: str) -> list[str]:
    """The command lines of the README's install and quickstart ``bash`` blocks, comments dropped."""
    lines: list[str] = []
    for heading in ("## Install", "## Quickstart"):
        section = readme.split(heading, 1)[1]
        block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
        if block is None:
            raise SystemExit(f"README.md: no bash block under {heading!r}")
        for line in block.group(1).splitlines():
            command = line.split("  #", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", action="store_true", help="keep the clone and its .venv (default: removed at the end)")
    args = p.parse_args(argv)
    lines = readme_lines((ROOT / "README.md").read_text(encoding="utf-8"))
    workdir = Path(tempfile.mkdtemp(prefix="agl-newcomer-"))
    lines = [line.replace("<this repository>", shlex.quote(str(ROOT))) for line in lines]
    cpu = next(
        (x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in x), "?"
    )
    print(f"[newcomer] {cpu}, in {workdir}; the README's lines:", flush=True)
    timings: list[tuple[str, float]] = []
    script = "set -euo pipefail\n"
    for i, line in enumerate(lines):
        script += f'{line}\necho "[newcomer-step] {i} $(date +%s.%N)"\n'
    started = time.time()
    last = started
    with subprocess.Popen(
        ["bash", "-c", script], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for out in proc.stdout:
            if out.startswith("[newcomer-step] "):
                index, stamp = out.split()[1:3]
                timings.append((lines[int(index)], float(stamp) - last))
                last = float(stamp)
                print(f"[newcomer] {float(stamp) - started:6.1f} s  {lines[int(index)]}", flush=True)
            elif "mean reward per round" in out or "evaluated:" in out:
                print(out.rstrip(), flush=True)
    total = time.time() - started
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode != 0:
        failed = lines[len(timings)] if len(timings) < len(lines) else "?"
        print(f"[newcomer] FAILED (rc {proc.returncode}) at: {failed}", file=sys.stderr)
        return 1
    print("\n| step | seconds |\n|---|---|")
    for line, seconds in timings:
        print(f"| `{line[:90]}` | {seconds:.1f} |")
    print(f"| **total** | **{total:.1f}** ({total / 60:.2f} min) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
