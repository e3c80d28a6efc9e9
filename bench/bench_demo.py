"""What a new user waits for: `./bootstrap invoke demo` in a fresh clone on an engine with nothing in it,
each stage as the demo times it, beside what the SIF conversion cannot go under.

A first run finds no image, container or volume: this benchmark removes every one of this Docker engine
first, so it runs only with HPCBOX_BENCH_WIPE=1. The clone is of this checkout's HEAD (commit first); it
has a cache, a state folder and a mini cluster name and port of its own, and its cluster is taken down
afterwards. The Python environment is made afresh by ./bootstrap in the clone, as a new user's is.

Docker is installed on this machine already, so its install is timed apart: ./bootstrap's apt step on a
bare Debian (every package its `apt_install` lines name, Docker's included) run in a container of the
demo's own Debian base, from the same mirror. The first run on a bare machine is that plus the command.
Not in it: dockerd's first start (bootstrap waits for it; a few seconds).

Rows: the first run on a bare machine (the goal); the command on this machine; the apt step; ./bootstrap's
own share (the command less the demo's own total); each of the demo's six stages (its closing line); and
the floor of the SIF inside the submit stage, `docker export` of the environment image read to the end
(the conversion reads every byte of it at least once).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import REPO, export_seconds, free_port
from hpcbox import minicluster
from hpcbox.build import baseimage
from hpcbox.errors import HpcboxError

TARGET_S = 120
_SUMMARY = re.compile(r"^hpcbox: the demo took ([0-9.]+) s: (.+)$", re.MULTILINE)


def _wipe() -> None:
    """Every container, image, volume and network of this engine removed, as on a fresh machine."""
    containers = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True, check=True).stdout
    if containers.split():
        subprocess.run(["docker", "rm", "-f", *containers.split()], capture_output=True, check=True)
    subprocess.run(["docker", "system", "prune", "-af", "--volumes"], capture_output=True, check=True)
    # BuildKit's cache outlives the prune here (seen: every build step cached after it), and the
    # Debian base is the same bytes each time, so its steps would all hit: emptied on its own.
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, check=True)
    counts = ["docker", "system", "df", "--format", "{{.TotalCount}} {{.Type}}"]
    left = subprocess.run(counts, capture_output=True, text=True, check=True).stdout
    if any(not line.startswith("0 ") for line in left.splitlines()):
        raise HpcboxError(f"the engine still holds something after its wipe: {left!r}")


def _bootstrap_packages() -> list[str]:
    """What ./bootstrap installs with apt on a bare Debian: the packages of its `apt_install` lines."""
    lines = re.findall(r"^\s*apt_install (.+)$", (REPO / "bootstrap").read_text(), re.MULTILINE)
    return sorted({package for line in lines for package in line.split()})


def _apt_install_seconds() -> float:
    """./bootstrap's apt step (update, then its packages) in a fresh container of the demo's Debian base."""
    packages = " ".join(_bootstrap_packages())
    script = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{packages} >/dev/null"
    )
    base = baseimage.base_ref(lock=baseimage.own_lock())
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", base, "sh", "-c", script], check=True, capture_output=True)
    return time.perf_counter() - started


def _environment_image(clone: Path, env: dict[str, str]) -> str:
    """The environment image the demo's submit built, as the clone's project names it."""
    script = (
        "from hpcbox.build.image import ENVIRONMENT, build_image\n"
        "from hpcbox.project.config import load_project\n"
        "print(build_image(load_project(), flavour='cpu', offline=True, target=ENVIRONMENT,"
        " say=lambda _l: None, on_line=lambda _l: None).ref)\n"
    )
    python = clone / ".venv" / "bin" / "python"
    done = subprocess.run(
        [python, "-c", script], cwd=clone, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def run() -> list[dict]:
    if os.environ.get("HPCBOX_BENCH_WIPE") != "1":
        raise HpcboxError(
            "bench_demo removes every container, image and volume of this Docker engine",
            "set HPCBOX_BENCH_WIPE=1 to let it, on a machine whose engine holds nothing you need",
        )
    _wipe()
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-demo-") as work:
        clone = Path(work) / "hpcbox"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        name = f"hpcboxbench-{uuid.uuid4().hex[:8]}"
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("VIRTUAL_ENV", "HPCBOX_"))
        }
        env |= {"HPCBOX_CACHE": str(Path(work) / "cache"), "XDG_STATE_HOME": str(Path(work) / "state")}
        command = ["./bootstrap", "invoke", "demo", f"--name={name}", f"--port={free_port()}"]
        try:
            started = time.perf_counter()
            done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, check=False)
            whole = time.perf_counter() - started
            if done.returncode != 0:
                raise HpcboxError(f"the demo exited {done.returncode}: {done.stderr[-3000:]}")
            export = export_seconds(_environment_image(clone, env))
            apt_install = _apt_install_seconds()
        finally:
            minicluster.down(name, Path(work) / "state" / "hpcbox" / "cluster")
    said = _SUMMARY.search(done.stderr + done.stdout)
    if said is None:
        raise HpcboxError("the demo printed no closing line with its stages' times")
    demo_total = float(said[1])
    stages = {stage.rsplit(" ", 2)[0]: float(stage.rsplit(" ", 2)[1]) for stage in said[2].split(", ")}
    rows = [
        _row(
            "first run on a bare Debian: Docker's install + the command",
            apt_install + whole,
            f"≤ {TARGET_S} s",
            "what a new user waits for (the two rows below)",
        ),
        _row("./bootstrap invoke demo, engine wiped, Docker installed", whole, None, None),
        _row(
            "./bootstrap's apt step on a bare Debian (Docker, git, mmdebstrap, ...)",
            apt_install,
            None,
            "timed in a container of the demo's base",
        ),
        _row(
            "./bootstrap (Python environment, bytecode)",
            whole - demo_total,
            None,
            "the command less the demo",
        ),
    ]
    rows += [_row(f"demo stage: {stage}", seconds, None, None) for stage, seconds in stages.items()]
    rows.append(
        _row("floor: docker export of the environment image", export, None, "inside the submit stage")
    )
    return rows


def _row(metric: str, value: float, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 1), "unit": "s", "target": target, "note": note}
