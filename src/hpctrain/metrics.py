"""What the trainer reports: JSON lines (metrics.jsonl and stdout), the weights digest, GPU samples."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch


class MetricsLog:
    """One JSON object per line, appended to metrics.jsonl and echoed to stdout (the Slurm log).

    Only rank 0 writes; the other ranks hold a disabled log so call sites need no rank checks.
    """

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        line = json.dumps({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=False)
        with self.path.open("a") as file:
            file.write(line + "\n")
        print(line, flush=True)


def warn(message: str) -> None:
    print(f"hpctrain: warning: {message}", file=sys.stderr, flush=True)


class EpochTotals:
    """Running sums of one epoch, kept on the device (no host sync per step) and checkpointable,
    so an epoch interrupted and resumed reports the same loss and accuracy as one that was not."""

    def __init__(self, device: torch.device, saved: dict[str, Any] | None = None) -> None:
        saved = saved or {}
        self.loss_sum = torch.tensor(saved.get("loss_sum", 0.0), dtype=torch.float64, device=device)
        self.correct = torch.tensor(saved.get("correct", 0), dtype=torch.int64, device=device)
        self.count = torch.tensor(saved.get("count", 0), dtype=torch.int64, device=device)

    def add(self, loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.loss_sum += loss.detach().double() * targets.numel()
        self.correct += (logits.detach().argmax(dim=1) == targets).sum()
        self.count += targets.numel()

    def packed(self) -> torch.Tensor:
        return torch.stack([self.loss_sum, self.correct.double(), self.count.double()])


def totals_record(packed: torch.Tensor) -> dict[str, Any]:
    """Totals summed over the ranks, as a checkpoint stores them."""
    loss_sum, correct, count = packed.tolist()
    return {"loss_sum": loss_sum, "correct": int(correct), "count": int(count)}


def summarise(packed: torch.Tensor) -> tuple[float, float, int]:
    """(mean loss, accuracy, samples) from totals summed over the ranks."""
    loss_sum, correct, count = packed.tolist()
    return loss_sum / max(count, 1), correct / max(count, 1), int(count)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the state dict (names and raw bytes, in order): equal digests, equal weights."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class GpuSampler:
    """`nvidia-smi --loop-ms` writing utilisation and memory to gpu-<host>.csv, one per node."""

    QUERY = "timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw"

    def __init__(self, output_dir: Path, interval_s: float) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.file: IO[bytes] | None = None
        program = shutil.which("nvidia-smi")
        if program is None or interval_s <= 0:
            return
        self.path = output_dir / f"gpu-{socket.gethostname()}.csv"
        self.file = self.path.open("ab")
        self.process = subprocess.Popen(
            [
                program,
                f"--query-gpu={self.QUERY}",
                "--format=csv,nounits",
                f"--loop-ms={int(interval_s * 1000)}",
            ],
            stdout=self.file,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.file is not None:
            self.file.close()
