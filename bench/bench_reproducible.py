"""What reproducibility costs the sif stage, on the cpu environment image, side by side in one run.

The conversion does two things only for reproducibility: it clamps every file time newer than the
source date (it lists those files in the mounted layers and hands mksquashfs a pseudo definition for
each), and it rewrites the SIF header's per-run fields (`normalise_header`). Measured here against the
same work without them:

- the image's squashfs made from its layers with clamping and without, alternated, best of 3 each
  (goal: under 10 % extra);
- `normalise_header` on a real SIF, against the whole conversion's time.

The build side's share is a build argument (`SOURCE_DATE_EPOCH`, read by `useradd` only) and deleting a
handful of log and cache files in the install steps: nothing to measure at this resolution.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from hpcbox.build.image import ENVIRONMENT, build_image
from hpcbox.project.config import load_project
from hpcbox.render.profiles import load_profile
from hpcbox.sif import rootfs
from hpcbox.sif.convert import _source_date_epoch, build_sif, normalise_header
from hpcbox.sif.helper import engine
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3


def _quiet(line: str) -> None:
    pass


def _squash(tool: Apptainer, layers: rootfs.Layers, args: list[str], epoch: int, scratch: Path) -> float:
    work = Path(tempfile.mkdtemp(dir=scratch))
    (work / "skeleton").mkdir()  # nothing of Apptainer's to put on top: the layers alone
    started = time.perf_counter()
    rootfs.make_squashfs(tool, work, layers, "rootfs.sqfs", 0, args, epoch, _quiet)
    seconds = time.perf_counter() - started
    shutil.rmtree(work)
    return seconds


def run() -> list[dict]:
    image = build_image(
        load_project(REPO), flavour="cpu", offline=True, target=ENVIRONMENT, say=_quiet, on_line=_quiet
    )
    raw = docker.client().api.inspect_image(image.id)
    epoch = _source_date_epoch(raw)
    assert epoch is not None, "the cpu environment is built on the pinned base: it has a source date"
    layers = rootfs.engine_layers(raw)
    assert layers is not None, "the engine stores images with overlay2"
    compression = load_profile("local").apptainer.compression
    tool = engine("container")
    clamped, plain = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="hpcbox-bench-reproducible-", dir="/var/tmp") as scratch:
            for _ in range(ROUNDS):
                args = compression.mksquashfs_args()
                plain.append(_squash(tool, layers, args, 0, Path(scratch)))  # epoch 0: nothing clamped
                clamped.append(_squash(tool, layers, args, epoch, Path(scratch)))
            started = time.perf_counter()
            sif = build_sif(
                image,
                compression=compression,
                cache=Path(scratch),
                say=_quiet,
                on_line=_quiet,
            )
            convert_s = time.perf_counter() - started
            started = time.perf_counter()
            normalise_header(sif.path, epoch, "bench")
            header_s = time.perf_counter() - started
    finally:
        if image.built:
            docker.remove_image(image.ref)
    return [
        {
            "metric": "squashfs of the layers, times clamped to the source date (best of 3)",
            "value": round(min(clamped), 2),
            "unit": "s",
            "note": "runs " + ", ".join(f"{s:.2f}" for s in clamped),
        },
        {
            "metric": "the same, nothing clamped (best of 3)",
            "value": round(min(plain), 2),
            "unit": "s",
            "note": "runs " + ", ".join(f"{s:.2f}" for s in plain),
        },
        {
            "metric": "clamping / not clamping",
            "value": round(min(clamped) / min(plain), 3),
            "unit": "ratio",
            "target": "< 1.10",
        },
        {
            "metric": "normalise_header on the SIF",
            "value": round(header_s * 1000, 2),
            "unit": "ms",
            "note": f"whole conversion ({sif.compression}, {sif.size / 1e6:.0f} MB) {convert_s:.1f} s: "
            f"{header_s / convert_s:.5f} of it",
        },
    ]
