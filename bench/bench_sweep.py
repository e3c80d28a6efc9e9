"""What a sweep costs as it grows: a 1,000-point sweep of a trivial program beside a 10-point one, on the
mini cluster, every command the whole CLI as a user types it.

For each size: `submit --sweep` (render one array job, ship, sbatch) to its job id; `status -j` and
`jobs` while the array runs; then, the array ended, `fetch` of every point's run folder and `report`.
Each command's seconds, and how many times it ran `ssh` (a shim first on PATH counts every ssh the
command starts: its SSH master and each command or rsync over it), so that a command that made one
round trip per task would show as a count that grows with the sweep. The ratio rows divide the
1,000-point figure by the 10-point one: 100 would be per-point cost, 1 none at all.

The program writes one small JSON file per point; the environment image and its SIF are built, and the
SIF is on the cluster, before the clock starts.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import copy_project, free_port
from hpcbox import jobs, minicluster
from hpcbox.build.image import build_image
from hpcbox.cli.demo import make_dataset
from hpcbox.project.config import load_project
from hpcbox.tools import ssh

SIZES = (10, 1000)
POINT = """\
import json, os, sys
with open(os.path.join(sys.argv[1], "point.json"), "w") as out:
    json.dump(sys.argv[2:], out)
"""
COMMANDS = ("submit", "status", "jobs", "fetch", "report")


def _shim(folder: Path, count: Path) -> Path:
    """A folder whose `ssh` appends a line to ``count`` and runs the real one."""
    real = subprocess.run(["sh", "-c", "command -v ssh"], capture_output=True, text=True, check=True).stdout
    script = folder / "ssh"
    script.write_text(f'#!/bin/sh\necho >> "{count}"\nexec {real.strip()} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _hpcbox(root: Path, env: dict[str, str], count: Path, *argv: str) -> tuple[float, int, str]:
    """`python -m hpcbox ARGV` in the project: (seconds to its exit, the ssh it started, its stdout)."""
    count.write_text("")
    started = time.perf_counter()
    command = [sys.executable, "-m", "hpcbox", *argv]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"hpcbox {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return took, len(count.read_text().splitlines()), done.stdout


def _sweep_project(root: Path, points: int) -> None:
    (root / "src" / "hpctrain" / "sweep_point.py").write_text(POINT)
    pyproject = root / "pyproject.toml"
    own_run = '[tool.hpcbox.run]\nscript = "src/hpctrain/sweep_point.py"\nargs = ["{output_dir}"]\n'
    pyproject.write_text(re.sub(r"\[tool\.hpcbox\.run\]\n(?:[^\[\n].*\n)*", own_run, pyproject.read_text()))
    (root / "sweep.toml").write_text("".join(f"[[points]]\nindex = {n}\n" for n in range(points)))


def run() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-sweep-") as work:
        root = copy_project(Path(work) / "project")
        count = Path(work) / "ssh-count"
        shim = _shim(Path(tempfile.mkdtemp(dir=work)), count)
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
        state = root / ".hpcbox" / "cluster"
        env = {**os.environ, "HPCBOX_CACHE": str(Path(work) / "cache"), "HPCBOX_MINICLUSTER": spec.name}
        env["HPCBOX_MINICLUSTER_STATE"] = str(state)
        env["PATH"] = f"{shim}:{env['PATH']}"
        image = build_image(load_project(root), flavour="cpu", offline=True, say=quiet, on_line=quiet)
        data = make_dataset(load_project(root), image.ref, say=quiet)
        submit = ("submit", "--cluster=local", "--offline", f"--data={data}", "--time=5")
        submit += ("--sweep=sweep.toml",)
        measured: dict[int, dict[str, tuple[float, int]]] = {}
        try:
            cluster = minicluster.up(spec, state)
            _sweep_project(root, 1)
            # The SIF, the dataset and the code on the cluster before the clock starts.
            _hpcbox(root, env, count, *submit)
            for size in SIZES:
                _sweep_project(root, size)
                took, sshs, out = _hpcbox(root, env, count, *submit)
                job_id = out.split()[-1]
                record = jobs.Ledger(load_project(root)).find(job_id, "local")
                measured[size] = {"submit": (took, sshs)}
                measured[size]["status"] = _hpcbox(root, env, count, "status", "-j", job_id)[:2]
                measured[size]["jobs"] = _hpcbox(root, env, count, "jobs")[:2]
                with ssh.Connection(cluster.ssh_target()) as connection:
                    jobs.wait(connection, record, timeout_s=7200, poll_s=5)
                measured[size]["fetch"] = _hpcbox(root, env, count, "fetch", "-j", job_id)[:2]
                fetched = len(list((root / "runs" / "local" / job_id).glob("*/point.json")))
                if fetched != size:
                    raise RuntimeError(f"fetch brought {fetched} of {size} points' results")
                measured[size]["report"] = _hpcbox(root, env, count, "report", "-j", job_id)[:2]
        finally:
            minicluster.down(spec.name, state)
    return _rows(measured)


def _rows(measured: dict[int, dict[str, tuple[float, int]]]) -> list[dict]:
    small, large = SIZES
    rows = []
    for command in COMMANDS:
        (small_s, small_ssh), (large_s, large_ssh) = measured[small][command], measured[large][command]
        rows += [
            _row(f"{command}: {small} points", small_s, "s", None, f"{small_ssh} ssh started"),
            _row(f"{command}: {large} points", large_s, "s", None, f"{large_ssh} ssh started"),
            _row(f"{command}: {large} / {small} points", large_s / small_s, "ratio", "< 100 (linear)",
                 f"ssh started: {large_ssh} against {small_ssh}"),
        ]  # fmt: skip
    return rows


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "target": target, "note": note}
