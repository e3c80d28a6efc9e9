"""Checkpoints: atomic writes, newest-valid-first loading, pruning.

A checkpoint is written to a temporary file in the same directory, fsynced, then renamed over
its final name, so a job killed at any moment leaves either the old set or the new one, never a
torn file. Loading walks the checkpoints newest first and skips any that fail to load (a disk
that filled up, a truncated copy), so one bad file costs one checkpoint interval, not the run.
torch is imported inside the functions that need it: prepare_dir runs before torch is loaded.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import HpctrainError

FORMAT = "hpctrain-checkpoint"
VERSION = 1
_NAME = re.compile(r"^ckpt-e(\d{4,})-s(\d{6,})\.pt$")
REQUIRED_KEYS = ("format", "version", "epoch", "step", "model", "optimizer", "scheduler", "rng", "config")


@dataclass(frozen=True)
class Position:
    """Where training stands: `epoch` whole epochs done, plus `step` batches into the next one."""

    epoch: int
    step: int

    @property
    def filename(self) -> str:
        return f"ckpt-e{self.epoch:04d}-s{self.step:06d}.pt"


def prepare_dir(directory: Path) -> None:
    """Create the checkpoint directory and prove it is writable, before any training starts."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise HpctrainError(
            f"checkpoint directory {directory} is not writable: {exc.strerror or exc}",
            hint="point --output-dir at a directory this user can write (e.g. under $HOME or scratch)",
        ) from None


def _positions(directory: Path) -> list[tuple[Position, Path]]:
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((Position(int(match[1]), int(match[2])), path))
    return sorted(found, key=lambda item: (item[0].epoch, item[0].step), reverse=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save(directory: Path, position: Position, state: dict[str, Any], keep: int) -> Path:
    import torch

    final = directory / position.filename
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a checkpoint is as shareable as any file
        with os.fdopen(fd, "wb") as file:
            torch.save({"format": FORMAT, "version": VERSION, **state}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # make the rename itself durable
    finally:
        os.close(directory_fd)
    for _, old in _positions(directory)[keep:]:
        old.unlink(missing_ok=True)
    return final


def _one_line(exc: Exception) -> str:
    """torch's load errors run to many lines; keep the one that names the problem."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return next((line for line in lines if "error" in line.lower()), lines[0])[:200]


def load_newest(directory: Path) -> tuple[dict[str, Any] | None, Path | None, list[tuple[Path, str]]]:
    """(state, path) of the newest checkpoint that loads, plus the (path, reason) of those skipped."""
    import torch

    skipped: list[tuple[Path, str]] = []
    for _, path in _positions(directory):
        try:
            data = path.read_bytes()
        except OSError as exc:  # unreadable is not corrupt: starting afresh would discard the run
            raise HpctrainError(
                f"cannot read checkpoint {path}: {exc.strerror or exc}",
                hint="fix its permissions, or move it away to start from the previous one",
            ) from None
        try:
            # weights_only: a checkpoint is data; never execute pickled code from a shared directory.
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            missing = [key for key in REQUIRED_KEYS if key not in state]
            if state.get("format") != FORMAT or missing:
                raise ValueError(f"not an {FORMAT} file (missing {', '.join(missing) or 'format tag'})")
            if state["version"] != VERSION:
                raise ValueError(f"format version {state['version']}, this trainer reads {VERSION}")
        except Exception as exc:  # any failure to load means "not a usable checkpoint", whatever raised it
            skipped.append((path, _one_line(exc)))
            continue
        return state, path, skipped
    return None, None, skipped
