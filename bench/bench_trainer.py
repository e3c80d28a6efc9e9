"""Trainer throughput on CPU: the small CNN on the digits, 0 DataLoader workers versus the default.

Builds (or reuses) the cpu trainer image, writes the digits archive with `make-data`, then trains
with `--workers 0` and with the default worker count (SLURM_CPUS_PER_TASK, else the CPUs this
container may use, minus one), alternating the two so that load from other processes hits both
alike. The first epoch of every run is warm-up (worker start, allocator) and left out; the rows are
medians over the other epochs of what the trainer itself reports in metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import statistics
import tarfile
import tempfile
from pathlib import Path

from hpcbox.build.image import build_image
from hpcbox.project.config import load_project
from hpcbox.tools import docker

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4
BATCH_SIZE = 64
ROUNDS = 2
# Data-bound = the training process waits for batches a large share of its time.
WAIT_TARGET = 0.25


def _run(client, ref: str, scratch: Path, *argv: str) -> None:
    container = client.containers.run(
        ref,
        list(argv),
        volumes={str(scratch): {"bind": "/scratch", "mode": "rw"}},
        user=None if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}",
        environment={"HOME": "/tmp"},
        name=f"hpcboxbench-trainer-{os.urandom(3).hex()}",
        detach=True,
    )
    try:
        status = container.wait(timeout=900)["StatusCode"]
        if status != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {status}: {container.logs().decode()[-2000:]}")
    finally:
        container.remove(force=True)


def _train(client, ref: str, scratch: Path, name: str, workers: str | None) -> list[dict]:
    argv = [
        "python",
        "-m",
        "hpctrain",
        "train",
        "--data-dir",
        "/scratch/data",
        "--output-dir",
        f"/scratch/{name}",
    ]
    argv += ["--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE)]
    if workers is not None:
        argv += ["--workers", workers]
    _run(client, ref, scratch, *argv)
    lines = (scratch / name / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [r for r in records if r["event"] == "epoch" and r["epoch"] > 1] + [
        r for r in records if r["event"] == "start"
    ]


def run() -> list[dict]:
    client = docker.client()
    image = build_image(load_project(REPO), offline=True, say=lambda _line: None, on_line=lambda _line: None)
    measured: dict[str, list[dict]] = {"0": [], "default": []}
    default_workers = None
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-trainer-") as tmp:
        scratch = Path(tmp)
        scratch.chmod(0o777)
        _run(
            client,
            image.ref,
            scratch,
            "python",
            "-m",
            "hpctrain",
            "make-data",
            "--out",
            "/scratch/digits.tar",
        )
        with tarfile.open(scratch / "digits.tar") as archive:
            archive.extractall(scratch / "data", filter="data")
        (scratch / "data").chmod(0o755)
        for round_number in range(ROUNDS):
            for label, workers in (("0", "0"), ("default", None)):
                records = _train(client, image.ref, scratch, f"{label}-{round_number}", workers)
                measured[label] += [r for r in records if r["event"] == "epoch"]
                if workers is None:
                    default_workers = next(r["workers"] for r in records if r["event"] == "start")

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in measured[label])

    setting = f"small CNN, digits 8x8, batch {BATCH_SIZE}, CPU; median of epochs 2-{EPOCHS} x {ROUNDS} runs"
    speed_default, speed_zero = median("default", "samples_per_s"), median("0", "samples_per_s")
    return [
        {
            "metric": "cnn_cpu_samples_per_s_default_workers",
            "value": speed_default,
            "unit": "samples/s",
            "target": None,
            "note": f"{setting}; default workers = {default_workers}",
        },
        {
            "metric": "cnn_cpu_samples_per_s_0_workers",
            "value": speed_zero,
            "unit": "samples/s",
            "target": None,
            "note": setting,
        },
        {
            "metric": "samples_per_s_ratio_default_to_0_workers",
            "value": round(speed_default / speed_zero, 3),
            "unit": "ratio",
            "target": None,
            "note": "side by side in one run, alternating",
        },
        {
            "metric": "data_wait_fraction_0_workers",
            "value": median("0", "data_wait_fraction"),
            "unit": "fraction of train time",
            "target": None,
            "note": "loading and transforming in the training process",
        },
        {
            "metric": "data_wait_fraction_default_workers",
            "value": median("default", "data_wait_fraction"),
            "unit": "fraction of train time",
            "target": f"< {WAIT_TARGET} (not data-bound)",
            "note": f"default workers = {default_workers}",
        },
    ]
