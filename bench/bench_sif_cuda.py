"""`invoke sif` on the cuda environment image (PyTorch with PyPI's CUDA wheels, ~7.5 GB), the SIF users
actually ship, at each compression a profile may choose, side by side in one run:

- `docker export` alone (read to /dev/null): the floor any conversion stands on;
- the fast path at gzip:9 (mksquashfs's default, hpcbox's default before profiles chose), gzip:1 (the
  default for sites not known to read zstd) and zstd at levels 1-9 (for sites that read it): time as a
  ratio to the export alone, size against gzip:9's (goals: zstd within 1.5x of the export and no larger
  than gzip:9; gzip within 3x);
- reproducibility: the image built again with no build cache under another name and converted at the
  `local` profile's compression: same content hash and the same SIF sha256 as the first.

The cuda image is built offline on the pinned base if missing (and then removed again, with the build
cache its builds left); every SIF goes to a scratch cache that is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from benchkit import build_cache_dropped, export_seconds
from hpcbox.build.image import ENVIRONMENT, LABEL_CONTENT, LABEL_REVISION, build_image
from hpcbox.build.provenance import inputs_revision
from hpcbox.project.config import load_project
from hpcbox.render.profiles import load_profile
from hpcbox.sif.compression import parse_compression
from hpcbox.sif.convert import build_sif
from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
# The old default first, the new ones after; zstd levels in between where the choice is made.
# HPCBOX_BENCH_COMPRESSIONS=gzip:1,zstd:3 measures only those (gzip:9's size then comes from the last
# results file, since a size does not depend on the machine's load).
COMPRESSIONS = ("gzip:9", "gzip:1", "zstd:1", "zstd:3", "zstd:5", "zstd:7", "zstd:9")
RESULTS = Path(__file__).resolve().parent / "results" / "sif_cuda.json"
# HPCBOX_BENCH_REBUILD=0 leaves out the no-cache rebuild (another 7.5 GB image and ~15 GB of build
# cache) and carries its row over from the last results file.
REBUILD = os.environ.get("HPCBOX_BENCH_REBUILD", "1") != "0"


def _compressions() -> tuple[str, ...]:
    chosen = os.environ.get("HPCBOX_BENCH_COMPRESSIONS")
    return tuple(c.strip() for c in chosen.split(",")) if chosen else COMPRESSIONS


def _carried(metric: str) -> dict:
    """A row of the last results file, for a run that leaves its measurement out."""
    previous = json.loads(RESULTS.read_text())
    row = next(r for r in previous["rows"] if r["metric"] == metric)
    if "not measured again" in row.get("note", ""):
        return row
    return {**row, "note": f"{row['note']} (not measured again: from the run of {previous['started']})"}


def _previous_gzip9() -> tuple[int, dict]:
    """gzip:9's size and row from the last results file, for a run that leaves it out."""
    carried = _carried("invoke sif --compression gzip:9")
    size_mb = float(carried["note"].split(", ")[1].split(" MB")[0])
    return int(size_mb * 1e6), carried


def _quiet(line: str) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class _Rebuilt:
    sha256: str
    content_hash: str


def _rebuilt(project, cache: Path, compression: str) -> tuple[float, _Rebuilt]:
    """The environment built again with no build cache under another name, and its SIF."""
    elsewhere = dataclasses.replace(project, image_repository=f"hpcbox-bench-rebuild-{os.getpid()}/trainer")
    started = time.perf_counter()
    image = build_image(
        elsewhere, flavour="cuda", offline=True, target=ENVIRONMENT, no_cache=True, say=_quiet, on_line=_quiet
    )
    seconds = time.perf_counter() - started
    try:
        sif = build_sif(
            image,
            compression=parse_compression(compression, "compression"),
            cache=cache,
            say=_quiet,
            on_line=_quiet,
        )
    finally:
        docker.remove_image(image.ref)
    return seconds, _Rebuilt(sif.sha256, image.labels[LABEL_CONTENT])


def run() -> list[dict]:
    with build_cache_dropped():  # each cuda build leaves ~7.5 GB of it once its image is removed
        return _measured()


def _measured() -> list[dict]:
    project = load_project(REPO)

    def build():
        return build_image(
            project, flavour="cuda", offline=True, target=ENVIRONMENT, say=_quiet, on_line=_quiet
        )

    image = build()
    if image.labels.get(LABEL_REVISION) != inputs_revision(
        project.root, (project.docker_dir, project.dockerfile)
    ):
        # Built from the same content at another commit of docker/ (changed and changed back, or built
        # before it was committed): its revision label, and so its SIF, differ from the rebuild's now,
        # which the reproducibility row compares.
        docker.remove_image(image.ref)
        image = build()
    shipped = str(load_profile("local").apptainer.compression)
    image_size = docker.image(image.ref).size
    mb = 1e6
    rows: list[dict] = [
        {"metric": "cuda environment image size (docker)", "value": round(image_size / mb), "unit": "MB"}
    ]
    results: dict[str, tuple[float, int, float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="hpcbox-bench-sif-cuda-", dir="/var/tmp") as scratch:
            export_s = export_seconds(image.id)
            for written in _compressions():
                load = os.getloadavg()[0]
                started = time.perf_counter()
                sif = build_sif(
                    image,
                    compression=parse_compression(written, "compression"),
                    cache=Path(scratch) / written.replace(":", "-"),
                    say=_quiet,
                    on_line=_quiet,
                )
                results[written] = (time.perf_counter() - started, sif.size, load)
                if written == shipped:
                    first = sif
                else:
                    sif.path.unlink()  # 4 GB each: keep only the one compared below
            export_again_s = export_seconds(image.id)
            if REBUILD:
                rebuild_s, again = _rebuilt(project, Path(scratch) / "again", shipped)
    finally:
        if image.built:
            docker.remove_image(image.ref)
    if REBUILD:
        identical = (again.sha256, again.content_hash) == (first.sha256, image.labels[LABEL_CONTENT])
        rows.append(
            {
                "metric": "cuda environment rebuilt with no build cache: same content hash and SIF sha256",
                "value": float(identical),
                "unit": "bool",
                "target": "1",
                "note": f"{shipped}, sha256 {first.sha256[:12]} vs {again.sha256[:12]}; the no-cache build "
                f"took {rebuild_s:.0f} s",
            }
        )
    else:
        rows.append(
            _carried("cuda environment rebuilt with no build cache: same content hash and SIF sha256")
        )
    export = min(export_s, export_again_s)
    rows.append(
        {
            "metric": "docker export alone (to /dev/null), best of 2",
            "value": round(export, 1),
            "unit": "s",
            "note": f"before the conversions {export_s:.1f} s, after {export_again_s:.1f} s",
        }
    )
    if "gzip:9" in results:
        gzip9_size = results["gzip:9"][1]
    else:
        gzip9_size, carried = _previous_gzip9()
        rows.append(carried)
    for written, (seconds, size, load) in results.items():
        target = "<= 1.5x export, size <= gzip:9" if written.startswith("zstd") else ""
        target = "<= 3x export" if written == "gzip:1" else target
        rows.append(
            {
                "metric": f"invoke sif --compression {written}",
                "value": round(seconds / export, 2),
                "unit": "x export",
                "target": target,
                "note": f"{seconds:.1f} s, {size / mb:.0f} MB ({size / gzip9_size:.3f} of gzip:9); "
                f"1-min load {load:.1f}",
            }
        )
    return rows
