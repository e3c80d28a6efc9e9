"""`invoke build` timings: cold offline build, no-op build, code-only change; ratios to cold.

Runs the real CLI (`invoke build --offline`) in a scratch copy of the project, one after the other in
one run, and removes the images it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]


def timed_build(project: Path, *extra: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "build", "--offline", *extra],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - started, done.stdout.strip().splitlines()[-1]


def run() -> list[dict]:
    repository = f"hpcboxbench-{os.urandom(3).hex()}/trainer"
    os.environ["HPCBOX_IMAGE_REPOSITORY"] = repository
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-") as scratch:
        project = Path(scratch)
        for name in ("pyproject.toml", "docker", "src/hpctrain"):
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, project / name)
        refs = []
        try:
            cold, ref = timed_build(project, "--no-cache")
            refs.append(ref)
            noop, _ = timed_build(project)
            init = project / "src/hpctrain/__init__.py"
            init.write_text(init.read_text() + f"\n# benchmark: a code-only change {os.urandom(8).hex()}\n")
            code_change, ref = timed_build(project)
            refs.append(ref)
        finally:
            for ref in refs:
                docker.remove_image(ref)
    return [
        {"metric": "cold offline build (cpu, --no-cache)", "value": round(cold, 1), "unit": "s"},
        {"metric": "no-op build (nothing changed)", "value": round(noop, 2), "unit": "s", "target": "< 3 s"},
        {"metric": "no-op / cold", "value": round(noop / cold, 4), "unit": "ratio"},
        {"metric": "code-only change build", "value": round(code_change, 2), "unit": "s"},
        {
            "metric": "code-only change / cold",
            "value": round(code_change / cold, 4),
            "unit": "ratio",
            "target": "< 0.10",
        },
    ]
