"""The on-disk dataset format: a directory of NumPy shards described by manifest.json.

    manifest.json                      {"format": "hpctrain-shards", "classes": [...], "splits": {...}}
    train-00000-images.npy             uint8, shape (N, H, W, C)
    train-00000-labels.npy             int64, shape (N,)
    val-00000-images.npy ...

Sites ask for one archive per dataset rather than thousands of small files (metadata servers of
parallel file systems suffer); the archive is copied to node-local scratch and extracted there,
and the shards are memory-mapped, so a dataset larger than RAM still loads lazily.
Reading the manifest needs only the standard library: it is checked before torch is imported.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import HpctrainError

FORMAT = "hpctrain-shards"
VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Shard:
    images: Path
    labels: Path
    count: int


@dataclass(frozen=True)
class Manifest:
    directory: Path
    name: str
    classes: tuple[str, ...]
    image_shape: tuple[int, int, int]  # H, W, C
    mean: tuple[float, ...]  # per channel, of pixel values scaled to [0, 1]
    std: tuple[float, ...]
    splits: dict[str, tuple[Shard, ...]]
    fingerprint: str  # sha256 of manifest.json: ties checkpoints to the data they were trained on

    def count(self, split: str) -> int:
        return sum(shard.count for shard in self.splits[split])


def manifest_record(
    name: str,
    classes: list[str],
    image_shape: tuple[int, int, int],
    mean: list[float],
    std: list[float],
    splits: dict[str, list[dict[str, Any]]],
    source: str,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "source": source,
        "classes": classes,
        "image_shape": list(image_shape),
        "mean": mean,
        "std": std,
        "splits": {
            split: {"count": sum(s["count"] for s in shards), "shards": shards}
            for split, shards in splits.items()
        },
    }


def read_manifest(data_dir: Path) -> Manifest:
    """The validated manifest of `data_dir`; every problem is an HpctrainError naming the fix."""
    if not data_dir.is_dir():
        raise HpctrainError(
            f"--data-dir {data_dir} does not exist or is not a directory",
            hint="extract the dataset archive there first (python -m hpctrain make-data writes one)",
        )
    path = data_dir / MANIFEST
    if not path.is_file():
        nested = sorted(p.parent for p in data_dir.glob(f"*/{MANIFEST}"))
        hint = f"did you mean --data-dir {nested[0]}?" if nested else "extract a dataset archive into it"
        raise HpctrainError(f"--data-dir {data_dir} has no {MANIFEST}", hint=hint)
    raw = path.read_bytes()
    try:
        record = json.loads(raw)
        if record.get("format") != FORMAT or record.get("version") != VERSION:
            raise ValueError(f"expected format {FORMAT!r} version {VERSION}")
        classes = tuple(str(c) for c in record["classes"])
        height, width, channels = (int(v) for v in record["image_shape"])
        mean = tuple(float(v) for v in record.get("mean", [0.5] * channels))
        std = tuple(float(v) for v in record.get("std", [0.25] * channels))
        splits = {
            split: tuple(
                Shard(data_dir / s["images"], data_dir / s["labels"], int(s["count"]))
                for s in record["splits"][split]["shards"]
            )
            for split in SPLITS
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise HpctrainError(f"{path} is not a valid hpctrain manifest: {exc}") from None
    if len(classes) < 2:
        raise HpctrainError(f"{path} lists {len(classes)} class(es); classification needs at least 2")
    if len(mean) != channels or len(std) != channels or min(std) <= 0:
        raise HpctrainError(f"{path}: mean/std must have one value per channel ({channels}) and std > 0")
    manifest = Manifest(
        directory=data_dir,
        name=str(record.get("name", data_dir.name)),
        classes=classes,
        image_shape=(height, width, channels),
        mean=mean,
        std=std,
        splits=splits,
        fingerprint=hashlib.sha256(raw).hexdigest(),
    )
    for split in SPLITS:
        if manifest.count(split) == 0:
            raise HpctrainError(f"--data-dir {data_dir}: the {split!r} split is empty (0 samples)")
        for shard in manifest.splits[split]:
            for file in (shard.images, shard.labels):
                if not file.is_file():
                    raise HpctrainError(
                        f"--data-dir {data_dir}: shard file {file.name} listed in {MANIFEST} is missing"
                    )
    return manifest
