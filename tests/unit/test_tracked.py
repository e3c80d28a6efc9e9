"""MLflow's file store and W&B's offline run log read as `watch` reads them: each run's newest values
since the last look, a line a run. MLflow's store as MLflow writes it, and W&B's log in a job, are the
integration test's (both libraries in a job, tests/integration/test_own_project.py); here MLflow's
growth look by look, and a log W&B's own library wrote (0.31.0, offline, outside any job: 400 steps,
147 KB, five of its 32 KiB blocks) read whole, grown a few KB a look, cut anywhere, and damaged."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from hpcbox.jobs.tracked import MlflowFigures, WandbFigures

# wandb.init(project="watch", mode="offline", id="golden-1"), then for step in range(400):
# run.log({"loss": round(100 / (step + 1), 6), "train": {"accuracy": round(step / 400, 6)}, "note": "text"},
# step=step)
WANDB_LOG = Path(__file__).parents[1] / "golden" / "wandb" / "run-golden-1-0.31.0.wandb.gz"
LAST_STEP = "wandb golden-1, step 399: loss 0.25, train.accuracy 0.9975"


def logged(run: Path, key: str, *lines: str) -> None:
    metric = run / "metrics" / key
    metric.parent.mkdir(parents=True, exist_ok=True)
    with metric.open("a") as file:
        file.write("".join(lines))


def test_each_look_says_each_runs_newest_values_since_the_last_and_a_line_still_coming_waits(tmp_path: Path):
    run = tmp_path / "mlruns" / "0" / "4f1c2a9e8b7d4c3a"
    (run / "tags").mkdir(parents=True)
    (run / "tags" / "mlflow.runName").write_text("mean")
    figures = MlflowFigures()
    assert figures.new_lines(tmp_path) == []  # a run with nothing logged yet

    logged(run, "loss", "1765100000000 25.0 0\n", "1765100000100 12.5 1\n")
    logged(run, "eval/accuracy", "1765100000100 0.25 1\n")
    assert figures.new_lines(tmp_path) == ["mlflow mean, step 1: eval/accuracy 0.25, loss 12.5"]
    assert figures.new_lines(tmp_path) == []  # nothing new: nothing said

    logged(run, "loss", "1765100000200 8.333333 2\n", "1765100000300 6.2")  # the last line half copied
    assert figures.new_lines(tmp_path) == ["mlflow mean, step 2: loss 8.333"]
    logged(run, "loss", "5 3\n")
    logged(run, "eval/accuracy", "1765100000300 0.5 3\n")
    assert figures.new_lines(tmp_path) == ["mlflow mean, step 3: eval/accuracy 0.5, loss 6.25"]
    logged(run, "loss", "1765100000400 5.0 4\n")
    logged(run, "eval/accuracy", "1765100000400 0.75 3\n")
    assert figures.new_lines(tmp_path) == ["mlflow mean: eval/accuracy 0.75 (step 3), loss 5 (step 4)"]


def test_a_sweeps_tasks_each_say_their_runs_and_an_unnamed_run_goes_by_its_id(tmp_path: Path):
    for task in ("0", "1"):
        logged(tmp_path / task / "mlruns" / "0" / f"a{task}b2c3d4e5f6a7b8", "loss", f"1 {task}.5 7\n")
    assert MlflowFigures().new_lines(tmp_path, tasks=True) == [
        "task 0: mlflow a0b2c3d4, step 7: loss 0.5",
        "task 1: mlflow a1b2c3d4, step 7: loss 1.5",
    ]


def wandb_run(root: Path, data: bytes, folder: str = "offline-run-20261207_162052-golden-1") -> Path:
    """``data`` as W&B lays out an offline run under WANDB_DIR ``root``, with its `latest-run` link."""
    log = root / "wandb" / folder / "run-golden-1.wandb"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(data)
    (root / "wandb" / "latest-run").unlink(missing_ok=True)
    (root / "wandb" / "latest-run").symlink_to(folder)
    return log


def test_a_wandb_log_read_whole_says_each_numbers_last_value_and_no_text_or_wandbs_own_keys(tmp_path: Path):
    wandb_run(tmp_path, gzip.decompress(WANDB_LOG.read_bytes()))
    figures = WandbFigures()
    assert figures.new_lines(tmp_path) == [LAST_STEP]  # once, not again through latest-run
    assert figures.new_lines(tmp_path) == []


def test_a_wandb_log_grown_a_few_kb_a_look_says_each_step_once_in_order_with_its_value(tmp_path: Path):
    data = gzip.decompress(WANDB_LOG.read_bytes())
    log = wandb_run(tmp_path, b"")
    figures, said = WandbFigures(), []
    for end in range(0, len(data), 4099):  # cut through chunks, records and the blocks' ends
        log.write_bytes(data[:end])
        said += figures.new_lines(tmp_path)
    log.write_bytes(data)
    said += figures.new_lines(tmp_path)
    steps = [int(re.search(r", step (\d+): ", line)[1]) for line in said]
    assert len(said) > 30 and steps == sorted(set(steps)), said
    for line, step in zip(said, steps, strict=True):
        assert (
            line
            == f"wandb golden-1, step {step}: loss {100 / (step + 1):.4g}, train.accuracy {step / 400:.4g}"
        )
    assert said[-1] == LAST_STEP


def test_a_damaged_wandb_log_is_read_to_its_damage_and_a_requeued_runs_second_log_said_as_its_own(
    tmp_path: Path,
):
    data = bytearray(gzip.decompress(WANDB_LOG.read_bytes()))
    data[len(data) // 2] ^= 0xFF  # a byte of the middle block flipped: its chunk fails its checksum
    wandb_run(tmp_path / "0", bytes(data))
    (tmp_path / "1" / "wandb" / "offline-run-x").mkdir(parents=True)
    (tmp_path / "1" / "wandb" / "offline-run-x" / "run-x.wandb").write_bytes(b"not a W&B log at all")
    said = WandbFigures().new_lines(tmp_path, tasks=True)
    assert len(said) == 1 and said[0].startswith("task 0: wandb golden-1, step ")
    step = int(re.search(r", step (\d+): ", said[0])[1])
    assert 100 < step < 300  # what comes before the damage
    # Requeued, W&B starts a folder of its own for the run (the same id, hpcbox's): its figures said too.
    wandb_run(tmp_path / "0", gzip.decompress(WANDB_LOG.read_bytes()), "offline-run-20261207_170000-golden-1")
    figures = WandbFigures()
    assert figures.new_lines(tmp_path / "0") == [said[0].removeprefix("task 0: "), LAST_STEP]
