"""agl installs as users install it: a wheel built with the standard build tool (pypa/build) goes into a fresh venv
with its extras, ``import agl`` works there without torch or any framework, and the quickstart runs from it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def test_the_wheel_installs_with_its_extras_into_a_fresh_venv_and_runs_the_quickstart(tmp_path: Path) -> None:
    run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", ROOT, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("agl-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    try:
        python = venv / "bin" / "python"
        # torch first and pinned, as the README says: an unpinned resolution would pull a CUDA build
        run(python, "-m", "pip", "install", "-q", "torch==2.13.0", cwd=tmp_path)
        constraints = ROOT / "scripts" / "constraints.txt"
        run(python, "-m", "pip", "install", "-q", "-c", constraints, f"{wheel}[langgraph,rl]", cwd=tmp_path)
        light = "import sys, agl; print(agl.__file__); assert not {'torch', 'langgraph'} & set(sys.modules)"
        assert str(venv) in run(python, "-c", light, cwd=tmp_path), "agl is imported from the installed wheel"
        work = tmp_path / "work"  # the example files alone: agl itself must come from the wheel
        shutil.copytree(ROOT / "examples" / "quickstart", work / "examples" / "quickstart")
        (work / "examples" / "__init__.py").touch()
        printed = run(python, "-m", "examples.quickstart.train", "--out", work / "run", cwd=work)
        assert "'succeeded': 4" in printed and "trained: mean reward per round" in printed
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 1.7 GB: pytest keeps the tmp folders of its last three runs
