"""`invoke build` timings: cold offline build, no-op build, code-only change, one Debian package added
to the cpu lock; ratios to cold.

Runs the real CLI (`invoke build --offline`) in a scratch copy of the project, one after the other in
one run, and removes the images it made. The cold build starts with BuildKit's cache of downloads
emptied (`docker builder prune --filter type=exec.cachemount`: this engine's cached downloads, every
project's), so that it downloads every package, as on a machine that never built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
# Small, with no dependency the cpu environment lacks: the step's other packages are the measure.
ADDED = "figlet=2.2.5-3+b2"


def timed_build(project: Path, *extra: str) -> tuple[float, str, str]:
    """Seconds, the image built and what its steps said of their downloads."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "build", "--offline", *extra],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if "this step installs" in line]
    return time.perf_counter() - started, done.stdout.strip().splitlines()[-1], "; ".join(said)


def downloaded_kb(said: str) -> float:
    """What the steps' lines say they downloaded (`N to download (16 kB)`, `(212.3 MB)`), in kB."""
    sizes = re.findall(r"to download \(([\d.]+) (kB|MB)\)", said)
    return sum(float(value) * (1000 if unit == "MB" else 1) for value, unit in sizes)


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
        subprocess.run(
            [docker.build_cli(), "builder", "prune", "--force", "--filter", "type=exec.cachemount"],
            capture_output=True,
            check=True,
        )
        try:
            cold, ref, cold_said = timed_build(project, "--no-cache")
            refs.append(ref)
            noop, _, _ = timed_build(project)
            init = project / "src/hpctrain/__init__.py"
            init.write_text(init.read_text() + f"\n# benchmark: a code-only change {os.urandom(8).hex()}\n")
            code_change, ref, _ = timed_build(project)
            refs.append(ref)
            lock = project / "docker/lock/apt-cpu.txt"
            lock.write_text(lock.read_text() + f"# benchmark {os.urandom(8).hex()}\n{ADDED}\n")
            added, ref, added_said = timed_build(project)
            refs.append(ref)
        finally:
            for ref in refs:
                docker.remove_image(ref)
    cold_mb = downloaded_kb(cold_said) / 1000
    return [
        {
            "metric": "cold offline build (cpu, --no-cache, nothing cached)",
            "value": round(cold, 1),
            "unit": "s",
            "note": f"downloaded {cold_mb:.1f} MB",
        },
        {"metric": "no-op build (nothing changed)", "value": round(noop, 2), "unit": "s", "target": "< 3 s"},
        {"metric": "no-op / cold", "value": round(noop / cold, 4), "unit": "ratio"},
        {"metric": "code-only change build", "value": round(code_change, 2), "unit": "s"},
        {
            "metric": "code-only change / cold",
            "value": round(code_change / cold, 4),
            "unit": "ratio",
            "target": "< 0.10",
        },
        {
            "metric": f"one Debian package added to apt-cpu.txt ({ADDED.split('=')[0]})",
            "value": round(added, 1),
            "unit": "s",
            "note": f"downloaded {downloaded_kb(added_said):.0f} kB (cold: {cold_mb:.1f} MB)",
        },
        {
            "metric": "one Debian package added / cold",
            "value": round(added / cold, 3),
            "unit": "ratio",
            "note": "the PyTorch step runs again: its packages come from the cache of downloads",
        },
    ]
