"""`make-data`: write scikit-learn's bundled handwritten digits as ONE archive of shards.

The digits ship inside scikit-learn (no download), 1,797 8x8 grey images of 0-9. The archive is
byte-for-byte reproducible (fixed member order, times and owners), so its checksum can be pinned.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from hpctrain import HpctrainError, shards

SPLIT_SEED = 20_260_101  # fixed: the held-out split must not move when the training seed does


def _stratified_split(labels: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SPLIT_SEED)
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val = max(1, round(len(members) * val_fraction))
        val.append(members[:n_val])
        train.append(members[n_val:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(val))


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_digits_archive(out: Path, shard_size: int, val_fraction: float, force: bool) -> dict:
    """Write the archive atomically (temp file + rename); returns the manifest record."""
    if out.suffix != ".tar":
        raise HpctrainError(f"--out {out}: the archive name must end in .tar")
    if not out.parent.is_dir():
        raise HpctrainError(f"--out {out}: directory {out.parent} does not exist")
    if out.exists() and not force:
        raise HpctrainError(f"--out {out} already exists", hint="pass --force to replace it")
    if shard_size < 1:
        raise HpctrainError(f"--shard-size must be >= 1 (got {shard_size})")
    if not 0 < val_fraction < 1:
        raise HpctrainError(f"--val-fraction must be between 0 and 1 (got {val_fraction})")

    from sklearn.datasets import load_digits

    digits = load_digits()
    # 0..16 intensities -> the 0..255 bytes any image file would hold.
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)[..., np.newaxis]
    labels = digits.target.astype(np.int64)
    train_idx, val_idx = _stratified_split(labels, val_fraction)
    scaled = images[train_idx].astype(np.float64) / 255
    members: dict[str, bytes] = {}
    splits: dict[str, list[dict]] = {}
    for split, index in (("train", train_idx), ("val", val_idx)):
        splits[split] = []
        for number, start in enumerate(range(0, len(index), shard_size)):
            part = index[start : start + shard_size]
            stem = f"{split}-{number:05d}"
            members[f"{stem}-images.npy"] = _npy_bytes(images[part])
            members[f"{stem}-labels.npy"] = _npy_bytes(labels[part])
            splits[split].append(
                {"images": f"{stem}-images.npy", "labels": f"{stem}-labels.npy", "count": len(part)}
            )
    record = shards.manifest_record(
        name="digits",
        classes=[str(c) for c in digits.target_names],
        image_shape=images.shape[1:],
        mean=[round(float(scaled.mean()), 6)],
        std=[round(float(scaled.std()), 6)],
        splits=splits,
        source="scikit-learn load_digits (UCI ML hand-written digits), bundled with scikit-learn",
    )

    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            _add(tar, shards.MANIFEST, (json.dumps(record, indent=2) + "\n").encode())
            for name in sorted(members):
                _add(tar, name, members[name])
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return record
