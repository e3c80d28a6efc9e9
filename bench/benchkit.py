"""What several benchmarks share: a free port for a mini cluster's login, a copy of this repository's
project to build and change (or to submit from, its environment built and its dataset made), the floor
of a SIF conversion (`docker export` read to the end), and the build cache of the cuda environments a
benchmark builds, removed again."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from hpcbox.build.image import build_image, record_image
from hpcbox.cli.demo import make_dataset
from hpcbox.project.config import ProjectConfig, load_project
from hpcbox.sif.rootfs import exported
from hpcbox.tools import docker
from hpcbox.tools.proc import free_local_port as free_port  # noqa: F401 (the benchmarks take it from here)

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "docker", "src/hpctrain")


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


def submitting_project(work: Path) -> tuple[ProjectConfig, Path, Path]:
    """A copy of this repository's project in ``work`` as a benchmark submits from it: its cpu
    environment built offline and recorded, its dataset made, and this process's SIF cache and mini
    clusters' state inside ``work``. The project, its mini clusters' state folder, the dataset."""
    quiet = lambda _line: None  # noqa: E731
    project = load_project(copy_project(work / "project"))
    state = project.root / ".hpcbox" / "cluster"
    os.environ.update({"HPCBOX_CACHE": str(work / "cache"), "HPCBOX_MINICLUSTER_STATE": str(state)})
    image = build_image(project, flavour="cpu", offline=True, say=quiet, on_line=quiet)
    record_image(project, image)
    return project, state, make_dataset(project, image.ref, say=quiet)


def export_seconds(image: str) -> float:
    """Seconds for `docker export` of a container of ``image`` (an id or a name), read to /dev/null: the
    floor any conversion of it stands on."""
    started = time.perf_counter()
    with exported(image) as chunks, open(os.devnull, "wb") as sink:
        for chunk in chunks:
            sink.write(chunk)
    return time.perf_counter() - started


@contextlib.contextmanager
def build_cache_dropped():
    """Within it, builds of the cuda environment; when it ends, the build cache records made while it ran
    that no build uses are removed, those on which others stand last (a record is removed only once
    nothing stands on it). A cuda environment leaves ~15 GB of build cache once its image is removed:
    a benchmark that builds three of them would fill the disk. Records older than it stay."""
    api = docker.client().api
    before = {record["ID"] for record in api.df().get("BuildCache") or ()}
    try:
        yield
    finally:
        while True:
            records = api.df().get("BuildCache") or ()
            stood_on = {
                parent
                for record in records
                for parent in (record.get("Parents") or ([record["Parent"]] if record.get("Parent") else []))
            }
            leaves = [
                record["ID"]
                for record in records
                if record["ID"] not in before and not record["InUse"] and record["ID"] not in stood_on
            ]
            if not leaves:
                break
            for leaf in leaves:
                api.prune_builds(filters={"id": [leaf]})
            if {record["ID"] for record in api.df().get("BuildCache") or ()} & set(leaves) == set(leaves):
                break  # none of them went: nothing more will
