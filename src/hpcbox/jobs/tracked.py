"""The figures MLflow and W&B keep in a job's output folder, said as `watch` says the trainer's metrics.

The job script points both at the output folder, which comes home with each look; each is read here
with neither tracker on this machine, so a program that logs with them rather than to metrics.jsonl is
watched too.

MLflow's file store is text: a run's folder `mlruns/<experiment>/<run>/` holds `metrics/<key>`, one line
`TIMESTAMP VALUE STEP` per value logged (a key with `/` in it, a file in a folder), and
`tags/mlflow.runName`, the run's name.

W&B's offline run (`wandb/offline-run-<time>-<id>/run-<id>.wandb`) is its transaction log: LevelDB's log
format (32 KiB blocks of chunks, each `crc32 length type` then its bytes, the file's 7-byte header in the
first block), each record a protobuf `Record` of wandb_internal.proto, which W&B marks as persistent on
disk. Its history records (field 2) hold the values logged (`HistoryItem`: key 1, nested keys 2, the
value as JSON 16) at a step (`HistoryStep`: num 1); its run record (field 17) the run's id (1) and
name (8).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path


class MlflowFigures:
    """What each metric file of the MLflow runs under a folder has been read to, and the figures new
    since, one line a run."""

    def __init__(self) -> None:
        self._read: dict[Path, int] = {}  # bytes of each metric file read

    def new_lines(self, folder: Path, *, tasks: bool = False) -> list[str]:
        """A line for each MLflow run under ``folder`` with values logged since the last call: each
        metric's newest, at its step; ``tasks``: ``folder`` holds a sweep's task folders, each named."""
        lines = []
        pattern = "*/mlruns/*/*/metrics" if tasks else "mlruns/*/*/metrics"
        for metrics in sorted(folder.glob(pattern)):
            newest = {}
            for file in sorted(path for path in metrics.rglob("*") if path.is_file()):
                if (last := self._newest(file)) is not None:
                    newest[file.relative_to(metrics).as_posix()] = last
            if newest:
                task = f"task {metrics.relative_to(folder).parts[0]}: " if tasks else ""
                lines.append(f"{task}mlflow {_run_name(metrics.parent)}{_said(newest)}")
        return lines

    def _newest(self, file: Path) -> tuple[float, int] | None:
        """The value and step of the last whole line of ``file`` past what was read; None if none."""
        whole = whole_lines_past(file, self._read.get(file, 0))
        self._read[file] = self._read.get(file, 0) + len(whole)
        for line in reversed(whole.decode(errors="replace").splitlines()):
            words = line.split()
            try:
                return float(words[1]), int(words[2]) if len(words) > 2 else 0
            except (IndexError, ValueError):
                continue
        return None


class WandbFigures:
    """Where each W&B offline run's log under a folder has been read to, and the figures logged since,
    one line a run."""

    def __init__(self) -> None:
        self._read: dict[Path, int] = {}  # the offset of the first chunk not yet read, in each log
        self._names: dict[Path, str] = {}

    def new_lines(self, folder: Path, *, tasks: bool = False) -> list[str]:
        """A line for each W&B run under ``folder`` with values logged since the last call: each key's
        newest, at its step; ``tasks``: ``folder`` holds a sweep's task folders, each named."""
        lines = []
        pattern = "*/wandb/*/run-*.wandb" if tasks else "wandb/*/run-*.wandb"
        # W&B's own `wandb/latest-run`, a link to the newest run's folder, left out: each run said once
        for log in sorted(path for path in folder.glob(pattern) if not path.parent.is_symlink()):
            newest: dict[str, tuple[float, int]] = {}
            for record in self._new_records(log):
                if (run := _field(record, 17)) is not None:
                    self._names[log] = _text(_field(run, 8)) or _text(_field(run, 1))
                elif (history := _field(record, 2)) is not None:
                    newest |= _history(history)
            if newest:
                task = f"task {log.relative_to(folder).parts[0]}: " if tasks else ""
                name = self._names.get(log) or log.stem.removeprefix("run-")
                lines.append(f"{task}wandb {name}{_said(dict(sorted(newest.items())))}")
        return lines

    def _new_records(self, log: Path) -> Iterator[bytes]:
        """The records of ``log`` whole past what was read: one whose chunks are not all there yet (still
        being copied, or written) waits for the next look."""
        at = self._read.get(log)
        with log.open("rb") as opened:
            if at is None:  # its first look: a W&B log, or nothing said of it
                if opened.read(_LOG_HEADER.size)[:4] != b":W&B":
                    return
                at = _LOG_HEADER.size
            opened.seek(at)
            data = opened.read()  # what is past the last whole record read, not the whole log again
        pieces: list[bytes] = []
        for end, kind, chunk in _chunks(data, at):
            pieces.append(chunk)
            if kind in (_FULL, _LAST):
                self._read[log] = end
                yield b"".join(pieces)
                pieces = []
            elif kind == _FIRST:
                pieces = [chunk]


_LOG_HEADER = struct.Struct("<4sHB")  # ":W&B", a magic number, the version
_CHUNK_HEADER = struct.Struct("<IHB")  # crc32 of the type and the bytes, their length, the type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes, offset: int) -> Iterator[tuple[int, int, bytes]]:
    """Each whole chunk of ``data``, the log's bytes from its offset ``offset`` on: where it ends in the
    log, its type and its bytes; up to the first that is not all there or not what its checksum says."""
    at = offset  # in the log: its blocks are counted from the log's start
    while True:
        if _BLOCK - at % _BLOCK < _CHUNK_HEADER.size:  # a block's tail too short for a chunk: padding
            at += _BLOCK - at % _BLOCK
        if at - offset + _CHUNK_HEADER.size > len(data):
            return
        checksum, length, kind = _CHUNK_HEADER.unpack_from(data, at - offset)
        start, end = at + _CHUNK_HEADER.size, at + _CHUNK_HEADER.size + length
        chunk = data[start - offset : end - offset]
        if kind not in (_FULL, _FIRST, _MIDDLE, _LAST) or end - offset > len(data):
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != checksum:
            return
        yield end, kind, chunk
        at = end


def _fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """A protobuf message's fields in order: each number, and its value (an integer, or the bytes of a
    length-delimited one)."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(message, at)
        elif wire == 2:
            length, at = _varint(message, at)
            value, at = message[at : at + length], at + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = int.from_bytes(message[at : at + size], "little"), at + size
        else:
            return
        yield number, value


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _field(message: bytes, number: int) -> bytes | None:
    """The last of a message's length-delimited fields ``number`` (protobuf's rule), None where absent."""
    found = None
    for each, value in _fields(message):
        if each == number and isinstance(value, bytes):
            found = value
    return found


def _text(value: bytes | None) -> str:
    return value.decode(errors="replace") if value else ""


def _history(history: bytes) -> dict[str, tuple[float, int]]:
    """The numbers a history record logged (W&B's own `_step`, `_runtime`... left out), each at its step."""
    step_field = _field(history, 2)
    step = next((value for number, value in _fields(step_field or b"") if number == 1), 0)
    found = {}
    for number, item in _fields(history):
        if number != 1 or not isinstance(item, bytes):
            continue
        fields = list(_fields(item))
        key = "".join(_text(v) for f, v in fields if f == 1) or ".".join(
            _text(v) for f, v in fields if f == 2
        )
        try:
            value = json.loads("".join(_text(v) for f, v in fields if f == 16))
        except ValueError:
            continue
        number_logged = (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
        if key and not key.startswith("_") and number_logged:
            found[key] = (float(value), int(step))
    return found


def whole_lines_past(file: Path, offset: int) -> bytes:
    """The whole lines of ``file`` past byte ``offset``: a line still being copied waits for the next
    look (the trainer's metrics.jsonl is read so too)."""
    with file.open("rb") as opened:
        opened.seek(offset)
        new = opened.read()
    return new[: new.rfind(b"\n") + 1]


def _run_name(run: Path) -> str:
    tag = run / "tags" / "mlflow.runName"
    name = tag.read_text().strip() if tag.is_file() else ""
    return name or run.name[:8]


def _said(newest: dict[str, tuple[float, int]]) -> str:
    """`, step 4: loss 5, accuracy 0.9`, or each metric's own step where they differ."""
    steps = {step for _, step in newest.values()}
    if len(steps) == 1:
        return f", step {steps.pop()}: " + ", ".join(
            f"{key} {value:.4g}" for key, (value, _) in newest.items()
        )
    return ": " + ", ".join(f"{key} {value:.4g} (step {step})" for key, (value, step) in newest.items())
