"""The trainer's torch-free front end: option resolution and manifest checks (no torch needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpctrain import HpctrainError, config, shards

REQUIRED = {"data_dir": "/data", "output_dir": "/out"}


def resolve(flags: dict[str, str] | None = None, env: dict[str, str] | None = None) -> config.TrainConfig:
    return config.resolve({**REQUIRED, **(flags or {})}, env or {})


def test_flag_beats_environment_beats_default() -> None:
    assert resolve().epochs == 10
    assert resolve(env={"EPOCHS": "4"}).epochs == 4
    assert resolve({"epochs": "2"}, {"EPOCHS": "4"}).epochs == 2
    assert resolve(env={"DATA_DIR": "/elsewhere"}).data_dir == Path("/data")
    assert config.resolve({}, {"DATA_DIR": "/d", "OUTPUT_DIR": "/o"}).data_dir == Path("/d")


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"batch_size": "0"}, {}, "--batch-size (env BATCH_SIZE) must be >= 1 (got 0)"),
        ({}, {"BATCH_SIZE": "-3"}, "--batch-size (env BATCH_SIZE) must be >= 1 (got -3)"),
        ({}, {"EPOCHS": "ten"}, "--epochs (env EPOCHS): cannot read 'ten'"),
        ({"model": "vgg"}, {}, "--model (env MODEL): unknown value 'vgg'; choose from cnn, resnet18"),
        ({"device": "tpu"}, {}, "unknown value 'tpu'"),
        ({"lr": "0"}, {}, "--lr (env LR) must be > 0"),
        ({"amp": "maybe"}, {}, "--amp (env AMP): cannot read 'maybe'"),
        ({"pretrained_weights": "/nope.pt"}, {}, "only applies to --model resnet18"),
    ],
)
def test_bad_values_name_the_flag_and_the_variable(flags: dict, env: dict, message: str) -> None:
    with pytest.raises(HpctrainError) as raised:
        resolve(flags, env)
    assert message in raised.value.message


def test_required_directories() -> None:
    with pytest.raises(HpctrainError, match=r"--data-dir \(env DATA_DIR\) is required"):
        config.resolve({"output_dir": "/o"}, {})


def test_defaults_that_depend_on_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    assert resolve().workers == 7  # one CPU stays with the training process
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert resolve().workers == 0
    assert resolve().freeze_epochs == 0
    assert resolve({"model": "resnet18"}).freeze_epochs == 1
    assert resolve({"model": "resnet18", "freeze_epochs": "0"}).freeze_epochs == 0


def _manifest(directory: Path, train_shards: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    val = [{"images": "v-images.npy", "labels": "v-labels.npy", "count": 2}]
    for name in ("v-images.npy", "v-labels.npy", *(s["images"] for s in train_shards)):
        (directory / name).write_bytes(b"")
    record = shards.manifest_record(
        "toy", ["a", "b"], (4, 4, 1), [0.5], [0.2], {"train": train_shards, "val": val}, "t"
    )
    (directory / shards.MANIFEST).write_text(json.dumps(record))
    return directory


def test_manifest_reads_and_fingerprints(tmp_path: Path) -> None:
    directory = _manifest(tmp_path / "ok", [{"images": "t-images.npy", "labels": "v-labels.npy", "count": 3}])
    manifest = shards.read_manifest(directory)
    assert (manifest.count("train"), manifest.count("val")) == (3, 2)
    assert manifest.image_shape == (4, 4, 1) and len(manifest.fingerprint) == 64


def test_manifest_problems_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HpctrainError, match="does not exist"):
        shards.read_manifest(tmp_path / "missing")
    _manifest(tmp_path / "outer" / "digits", [{"images": "t.npy", "labels": "v-labels.npy", "count": 1}])
    with pytest.raises(HpctrainError) as nested:
        shards.read_manifest(tmp_path / "outer")
    assert "did you mean --data-dir" in nested.value.hint and nested.value.hint.endswith("digits?")
    with pytest.raises(HpctrainError, match="'train' split is empty"):
        shards.read_manifest(_manifest(tmp_path / "empty", []))
    broken = _manifest(tmp_path / "gone", [{"images": "t.npy", "labels": "v-labels.npy", "count": 1}])
    (broken / "t.npy").unlink()
    with pytest.raises(HpctrainError, match=re.escape("shard file t.npy listed in manifest.json is missing")):
        shards.read_manifest(broken)
