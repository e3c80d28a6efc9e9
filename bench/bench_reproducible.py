"""What reproducibility costs the sif stage, on the cpu environment image, side by side in one run.

The conversion does two things only for reproducibility: it clamps every file time newer than the
source date while streaming `docker export` into mksquashfs, and it rewrites the SIF header's per-run
fields (`normalise_header`). Measured here against the same work without them:

- the export streamed through hpcbox's tar filter to /dev/null with clamping and without, alternated,
  best of 3 each (goal: under 10 % extra);
- `normalise_header` on a real SIF, against the whole conversion's time.

The build side's share is a build argument (`SOURCE_DATE_EPOCH`, read by `useradd` only) and deleting a
handful of log and cache files in the install steps: nothing to measure at this resolution.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from hpcbox.config import load_project
from hpcbox.image import ENVIRONMENT, build_image
from hpcbox.profiles import load_profile
from hpcbox.sif import _filter_export, _source_date_epoch, build_sif, exported, normalise_header
from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 3


def _quiet(line: str) -> None:
    pass


def _stream(image_id: str, epoch: int) -> float:
    started = time.perf_counter()
    with exported(image_id) as chunks, open(os.devnull, "wb") as sink:
        _filter_export(chunks, sink, b"", epoch, lambda _done: None)
    return time.perf_counter() - started


def run() -> list[dict]:
    image = build_image(
        load_project(REPO), flavour="cpu", offline=True, target=ENVIRONMENT, say=_quiet, on_line=_quiet
    )
    epoch = _source_date_epoch(docker.client().api.inspect_image(image.id))
    assert epoch is not None, "the cpu environment is built on the pinned base: it has a source date"
    clamped, plain = [], []
    try:
        for _ in range(ROUNDS):
            plain.append(_stream(image.id, 0))  # epoch 0: the filter clamps nothing
            clamped.append(_stream(image.id, epoch))
        with tempfile.TemporaryDirectory(prefix="hpcbox-bench-reproducible-", dir="/var/tmp") as scratch:
            started = time.perf_counter()
            sif = build_sif(
                image,
                compression=load_profile("local").apptainer.compression,
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
            "metric": "export through the tar filter, times clamped to the source date (best of 3)",
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
