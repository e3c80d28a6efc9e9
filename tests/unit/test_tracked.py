"""MLflow's file store read as `watch` reads it: each run's newest values since the last look, a line a
run. The store's format as MLflow writes it is the integration test's (a real MLflow in a job,
tests/integration/test_own_project.py); here its growth, look by look."""

from __future__ import annotations

from pathlib import Path

from hpcbox.jobs.tracked import MlflowFigures


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
