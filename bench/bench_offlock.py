"""What an off-lock build costs, against the same build on-lock, side by side in one run.

Debian moving on is simulated as the tests do it: a copy of this repository's project in which one pin
of docker/lock/apt-system.txt names a version Debian never served. What a user waits for:

- `hpcbox build` of the cpu environment with no build cache, as on a fresh machine: on-lock (the copy
  as committed) and off-lock (the locked build stops at its apt step, apt is asked what Debian serves,
  and the build runs again with that), alternated, best of 2 each;
- `hpcbox build` when the image is already there: on-lock (found by its tag) and off-lock (found by
  the label of the locked build it stands in for), best of 5 each.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from hpcbox.build.image import ENVIRONMENT, build_image
from hpcbox.project.config import load_project
from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "docker", "src/hpctrain")
BUILD_ROUNDS = 2
FOUND_ROUNDS = 5


def _quiet(line: str) -> None:
    pass


def _copy(root: Path, moved: bool) -> Path:
    for name in PROJECT_FILES:
        source, target = REPO / name, root / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if moved:
        lock = root / "docker/lock/apt-system.txt"
        lock.write_text(
            re.sub(r"(?m)^ca-certificates=.*$", "ca-certificates=20250419+hpcbox.gone", lock.read_text())
        )
    return root


def _build(root: Path, no_cache: bool) -> tuple[float, str, int]:
    started = time.perf_counter()
    said: list[str] = []
    image = build_image(
        load_project(root),
        flavour="cpu",
        offline=True,
        target=ENVIRONMENT,
        no_cache=no_cache,
        say=said.append,
        on_line=_quiet,
    )
    return time.perf_counter() - started, image.ref, sum("Debian moved on" in line for line in said)


def run() -> list[dict]:
    scratch = Path(tempfile.mkdtemp(prefix="hpcbox-bench-offlock-"))
    repository = f"hpcbox-bench/offlock-{os.urandom(3).hex()}"
    os.environ["HPCBOX_IMAGE_REPOSITORY"] = repository
    roots = {kind: _copy(scratch / kind, moved=kind == "off-lock") for kind in ("on-lock", "off-lock")}
    cold: dict[str, list[float]] = {kind: [] for kind in roots}
    found: dict[str, list[float]] = {kind: [] for kind in roots}
    lines: dict[str, int] = {}
    try:
        for _ in range(BUILD_ROUNDS):
            for kind, root in roots.items():
                seconds, _ref, lines[kind] = _build(root, no_cache=True)
                cold[kind].append(seconds)
        for _ in range(FOUND_ROUNDS):
            for kind, root in roots.items():
                seconds, _ref, _lines = _build(root, no_cache=False)
                found[kind].append(seconds)
    finally:
        for image in docker.client().images.list(name=f"{repository}-{ENVIRONMENT}"):
            for tag in image.tags:
                docker.remove_image(tag)
        shutil.rmtree(scratch, ignore_errors=True)
        del os.environ["HPCBOX_IMAGE_REPOSITORY"]
    assert lines == {"on-lock": 0, "off-lock": 1}, lines
    on, off = min(cold["on-lock"]), min(cold["off-lock"])
    found_on, found_off = min(found["on-lock"]), min(found["off-lock"])
    return [
        {
            "metric": "cpu environment, no build cache, on-lock",
            "value": round(on, 1),
            "unit": "s",
            "note": f"best of {BUILD_ROUNDS}: {', '.join(f'{s:.1f}' for s in cold['on-lock'])}",
        },
        {
            "metric": "cpu environment, no build cache, off-lock (one moved pin)",
            "value": round(off, 1),
            "unit": "s",
            "note": f"best of {BUILD_ROUNDS}: {', '.join(f'{s:.1f}' for s in cold['off-lock'])}",
        },
        {
            "metric": "off-lock / on-lock, no build cache",
            "value": round(off / on, 3),
            "unit": "ratio",
            "note": "the locked attempt up to its failing apt step, and asking apt what Debian serves",
        },
        {
            "metric": "up to date, on-lock (found by tag)",
            "value": round(found_on * 1000, 1),
            "unit": "ms",
            "note": f"best of {FOUND_ROUNDS}",
        },
        {
            "metric": "up to date, off-lock (found by its stand-in label)",
            "value": round(found_off * 1000, 1),
            "unit": "ms",
            "note": f"best of {FOUND_ROUNDS}",
        },
        {
            "metric": "off-lock / on-lock, up to date",
            "value": round(found_off / found_on, 3),
            "unit": "ratio",
        },
    ]
