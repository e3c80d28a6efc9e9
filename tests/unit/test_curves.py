"""The example trainer's curves (src/hpctrain/curves.py), read back with TensorBoard's own reader: the
points as written, on one step axis across a resume, the steps trained again after a resume from an
older checkpoint shown once, from the resumed run."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain.curves import Curves, crc32c


def read(directory: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return {
        tag: [(point.step, point.value) for point in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def test_tensorboard_reads_the_points_as_written(tmp_path: Path):
    curves = Curves(tmp_path / "tensorboard", enabled=True)
    curves.scalars(10, {"train/step_loss": 2.5})
    curves.scalars(20, {"train/step_loss": 1.25, "val/accuracy": 0.5})
    # Read while the file is still open, as a copy taken while the job runs is.
    assert read(tmp_path / "tensorboard") == {  # each exact in a 32-bit float
        "train/step_loss": [(10, 2.5), (20, 1.25)],
        "val/accuracy": [(20, 0.5)],
    }
    curves.close()


def test_a_resumed_run_carries_on_the_same_curves_and_what_it_trains_again_is_shown_once(tmp_path: Path):
    """The first run got to step 40; its last checkpoint was at step 20 (a node lost, say): the resumed
    run trains steps 21-40 again, and only its points are shown for them."""
    first = Curves(tmp_path, enabled=True)
    for step in (10, 20, 30, 40):
        first.scalars(step, {"train/step_loss": 1.0 / step})
    first.close()
    resumed = Curves(tmp_path, enabled=True)
    resumed.resume(20)
    for step in (30, 40, 50):
        resumed.scalars(step, {"train/step_loss": 2.0 / step})
    resumed.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    # TensorBoard keeps a point's value as a 32-bit float.
    assert read(tmp_path) == {
        "train/step_loss": [(step, pytest.approx(value, rel=1e-6)) for step, value in
                            [(10, 1 / 10), (20, 1 / 20), (30, 2 / 30), (40, 2 / 40), (50, 2 / 50)]]
    }  # fmt: skip


def test_a_disabled_writer_writes_nothing(tmp_path: Path):
    curves = Curves(tmp_path / "tensorboard", enabled=False)  # a rank other than 0
    curves.scalars(1, {"train/loss": 1.0})
    curves.resume(1)
    assert not (tmp_path / "tensorboard").exists()


def test_the_checksum_is_crc32c():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
