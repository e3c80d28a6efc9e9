"""Training configuration: one table of options, resolved from flags, then environment, then defaults.

Torch-free on purpose: every value is checked here, before the (slow) torch import, so a typo in a
job script costs a second, not a queue wait plus a model build.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import HpctrainError

MODELS = ("cnn", "resnet18")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Option:
    """One training setting: its flag, environment variable, type, default and check."""

    name: str
    kind: Callable[[str], Any]
    default: Any
    help: str
    check: Callable[[Any], str] | None = None  # returns "" when valid, else what is wrong
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.name.upper()


def _at_least(low: float) -> Callable[[Any], str]:
    return lambda value: "" if value >= low else f"must be >= {low:g} (got {value:g})"


def _positive(value: float) -> str:
    return "" if value > 0 else f"must be > 0 (got {value:g})"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _default_workers() -> int:
    """What the scheduler gave this task, minus one CPU for the training process itself."""
    slurm_cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    cpus = int(slurm_cpus) if slurm_cpus.isdigit() else len(os.sched_getaffinity(0))
    return max(cpus - 1, 0)


# `None` as a default means "decided later from other settings" (see resolve()).
OPTIONS: tuple[Option, ...] = (
    Option("data_dir", Path, None, "directory holding the extracted dataset (manifest.json + shards)"),
    Option("output_dir", Path, None, "directory for checkpoints/ and metrics.jsonl (created if missing)"),
    Option("model", str, "cnn", "model to train", choices=MODELS),
    Option("epochs", int, 10, "number of passes over the training data", _at_least(1)),
    Option("batch_size", int, 64, "samples per batch on each process", _at_least(1)),
    Option("lr", float, 0.05, "SGD learning rate (cosine-annealed over the epochs)", _positive),
    Option("momentum", float, 0.9, "SGD momentum", _at_least(0)),
    Option("weight_decay", float, 5e-4, "SGD weight decay", _at_least(0)),
    Option("seed", int, 0, "seed for initialisation and shuffling (same seed, same result)", _at_least(0)),
    Option(
        "device",
        str,
        "auto",
        "auto = CUDA when available, else CPU; a job Slurm gave GPUs stops if it cannot use them",
        choices=DEVICES,
    ),
    Option(
        "workers",
        int,
        None,
        "DataLoader worker processes (default: SLURM_CPUS_PER_TASK, else the CPUs this process may use, "
        "minus one)",
        _at_least(0),
    ),
    Option(
        "freeze_epochs",
        int,
        None,
        "epochs that train only the classifier head before all layers are unfrozen "
        "(default: 1 for resnet18, 0 for cnn)",
        _at_least(0),
    ),
    Option(
        "image_size",
        int,
        None,
        "side length images are resized to (default: the data's own for cnn, at least 32 for resnet18)",
        _at_least(1),
    ),
    Option(
        "pretrained_weights", Path, None, "resnet18 only: a local torchvision state-dict file to start from"
    ),
    Option("amp", _bool, None, "mixed precision (default: on with CUDA, off on CPU)"),
    Option("keep_checkpoints", int, 2, "how many of the newest checkpoints to keep", _at_least(1)),
    Option(
        "log_interval",
        int,
        0,
        "also log a 'step' metrics line every N steps (0: only per epoch)",
        _at_least(0),
    ),
    Option(
        "steps_per_epoch", int, 0, "cap on training steps per epoch, for smoke runs (0: no cap)", _at_least(0)
    ),
    Option(
        "step_pause",
        float,
        0.0,
        "seconds to rest after each training step, for rehearsals that wait for a time limit or a signal "
        "without holding a CPU the whole time; a job signal ends the rest (0: none; the results are the "
        "same)",
        _at_least(0),
    ),
    Option(
        "gpu_sample_interval",
        float,
        2.0,
        "seconds between nvidia-smi samples written to gpu-<host>.csv (0: off; CUDA only)",
        _at_least(0),
    ),
)


@dataclass(frozen=True)
class TrainConfig:
    data_dir: Path
    output_dir: Path
    model: str
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    device: str
    workers: int
    freeze_epochs: int
    image_size: int | None  # None: keep the data's own size
    pretrained_weights: Path | None
    amp: bool | None  # None: decided once the device is known
    keep_checkpoints: int
    log_interval: int
    steps_per_epoch: int
    step_pause: float
    gpu_sample_interval: float

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def as_record(self) -> dict[str, Any]:
        """JSON-friendly form, stored in checkpoints and in the metrics 'start' line."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


# Settings a resumed run must share with the checkpoint it resumes, or the result would silently differ.
RESUME_INVARIANTS = (
    "model",
    "epochs",
    "batch_size",
    "lr",
    "momentum",
    "weight_decay",
    "seed",
    "freeze_epochs",
    "image_size",
    "steps_per_epoch",
)


def _where(option: Option) -> str:
    return f"{option.flag} (env {option.env})"


def resolve(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> TrainConfig:
    """Flag value if given, else environment variable, else default; every value converted and checked."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = flags.get(option.name)
        if raw is None:
            raw = environ.get(option.env) or None
        if raw is None:
            values[option.name] = option.default
            continue
        try:
            value = option.kind(raw)
        except ValueError as exc:
            raise HpctrainError(f"{_where(option)}: cannot read {raw!r}: {exc}") from None
        if option.choices and value not in option.choices:
            raise HpctrainError(
                f"{_where(option)}: unknown value {value!r}; choose from {', '.join(option.choices)}"
            )
        problem = option.check(value) if option.check else ""
        if problem:
            raise HpctrainError(f"{_where(option)} {problem}")
        values[option.name] = value

    for required in ("data_dir", "output_dir"):
        if values[required] is None:
            option = next(o for o in OPTIONS if o.name == required)
            raise HpctrainError(f"{_where(option)} is required")
    if values["workers"] is None:
        values["workers"] = _default_workers()
    if values["freeze_epochs"] is None:
        values["freeze_epochs"] = 1 if values["model"] == "resnet18" else 0
    if values["pretrained_weights"] is not None:
        if values["model"] != "resnet18":
            raise HpctrainError("--pretrained-weights only applies to --model resnet18")
        if not values["pretrained_weights"].is_file():
            raise HpctrainError(f"--pretrained-weights: no such file {values['pretrained_weights']}")
    return TrainConfig(**values)
