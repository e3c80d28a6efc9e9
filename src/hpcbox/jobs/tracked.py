"""The figures MLflow keeps in a job's output folder, said as `watch` says the trainer's metrics.

The job script points MLflow at a file store in the output folder (`mlruns/`), which comes home with
each look. That store is text: a run's folder `mlruns/<experiment>/<run>/` holds `metrics/<key>`, one
line `TIMESTAMP VALUE STEP` per value logged (a key with `/` in it, a file in a folder), and
`tags/mlflow.runName`, the run's name. Read as text, a program that logs with MLflow rather than to
metrics.jsonl is watched too, with no MLflow on this machine.
"""

from __future__ import annotations

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
