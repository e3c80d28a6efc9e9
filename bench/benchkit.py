"""What several benchmarks share: a free port for a mini cluster's login, a copy of this repository's
project to build and change, and the floor of a SIF conversion (`docker export` read to the end)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

from hpcbox.sif.rootfs import exported

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "docker", "src/hpctrain")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def copy_project(into: Path) -> Path:
    """This repository's project (its image inputs and the example trainer) at ``into``, a new folder."""
    into.mkdir()
    for name in PROJECT_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def export_seconds(image: str) -> float:
    """Seconds for `docker export` of a container of ``image`` (an id or a name), read to /dev/null: the
    floor any conversion of it stands on."""
    started = time.perf_counter()
    with exported(image) as chunks, open(os.devnull, "wb") as sink:
        for chunk in chunks:
            sink.write(chunk)
    return time.perf_counter() - started
