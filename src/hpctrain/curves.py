"""Training curves as TensorBoard reads them: event files in the output folder, written as training goes.

TensorBoard's format is a TFRecord file of `Event` protocol buffers; the few fields the curves need
are written here with the standard library (no TensorBoard, TensorFlow or protobuf in the image), as
TensorBoard's own writer lays them out. Every point is on one axis, the training steps done since the
run began (kept in the checkpoints), so a run that is requeued and resumed carries on the same curves:
its new file starts by telling TensorBoard to drop what an earlier file holds from that step on (the
steps trained again after a resume from an older checkpoint), as `SummaryWriter(purge_step=)` does.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import BinaryIO

FILE_VERSION = "brain.Event:2"
_SESSION_START = 1  # SessionLog.START


class Curves:
    """One event file of the run (a new file per start, as TensorBoard's writers do); only rank 0
    writes, the other ranks hold a disabled one."""

    def __init__(self, directory: Path, enabled: bool) -> None:
        self.file: BinaryIO | None = None
        if not enabled:
            return
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        number = 0
        while (directory / f"{stem}.{number}").exists():  # a start within the same second, same pid
            number += 1
        self.file = (directory / f"{stem}.{number}").open("ab")
        self._write(_event(time.time(), 0, _string(3, FILE_VERSION)))

    def resume(self, step: int) -> None:
        """The run carries on after ``step`` steps: whatever earlier files hold past it is dropped."""
        self._write(_event(time.time(), step + 1, _message(7, _varint_field(1, _SESSION_START))))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Points at ``step`` of the curves named by ``values``' keys (`train/loss`), flushed at once so
        that a copy of the folder taken while the job runs has them."""
        summary = b"".join(
            _message(1, _string(1, tag) + _fixed32_float(2, float(value))) for tag, value in values.items()
        )
        self._write(_event(time.time(), step, _message(5, summary)))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def _write(self, event: bytes) -> None:
        if self.file is None:
            return
        length = struct.pack("<Q", len(event))
        record = (
            length + struct.pack("<I", _masked_crc(length)) + event + struct.pack("<I", _masked_crc(event))
        )
        self.file.write(record)
        self.file.flush()


# -- protocol buffers: the wire format of the fields used ------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _varint_field(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def _message(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _string(field: int, text: str) -> bytes:
    return _message(field, text.encode())


def _fixed32_float(field: int, value: float) -> bytes:
    return _key(field, 5) + struct.pack("<f", value)


def _event(wall_time: float, step: int, payload: bytes) -> bytes:
    """Event: wall_time (1, double), step (2, int64), then the payload's own field."""
    return _key(1, 1) + struct.pack("<d", wall_time) + _varint_field(2, step) + payload


# -- TFRecord's checksum: CRC-32C, masked ------------------------------------------------------------


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
