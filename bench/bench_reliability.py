"""Reliability: every scenario of "jobs that lose nothing", run for real (mini cluster, Apptainer,
Slurm), each row its measured outcome. `invoke bench --name reliability` reruns them (about 10 min).

Each scenario is the set of tests that exercise it; a test asserts its outcome (job states, results on
shared storage, 0 bytes left on every node's scratch, one-line refusals with nothing changed), so a
scenario's row is how many of its checks held in this run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCENARIOS = {
    "time limit: USR1 → checkpoint → requeue → resume → complete (1 and 2 nodes)": [
        "tests/integration/test_sbatch_cluster.py::test_time_limit_checkpoints_requeues_and_resumes",
        "tests/integration/test_sbatch_cluster.py::test_two_node_time_limit_checkpoints_requeues_and_resumes",
        "tests/unit/test_render.py::test_usr1_before_the_time_limit_is_forwarded_and_the_job_requeued",
    ],
    "node killed mid-run: requeued, resumed on the other node from the periodic copy, completed": [
        "tests/integration/test_node_loss.py",
        "tests/unit/test_render.py::test_checkpoints_reach_shared_storage_while_the_job_runs",
    ],
    "success, failure, cancel, timeout (1 and 2 nodes): results kept, 0 bytes left on any node's scratch": [
        "tests/integration/test_sbatch_cluster.py::test_local_script_runs_the_trainer_in_apptainer_and_cleans_up",
        "tests/integration/test_sbatch_cluster.py::test_failing_trainer_leaves_no_scratch_and_keeps_its_log",
        "tests/integration/test_sbatch_cluster.py::test_scancel_copies_back_what_the_trainer_wrote_and_cleans_up",
        "tests/integration/test_sbatch_cluster.py::test_two_nodes_train_one_ddp_run_in_apptainer",
        "tests/integration/test_sbatch_cluster.py::test_two_node_time_limit_checkpoints_requeues_and_resumes",
        "tests/integration/test_sbatch_cluster.py::test_two_node_job_past_its_time_limit_keeps_its_output_and_leaves_no_scratch",
        "tests/integration/test_submit.py::test_cancel_keeps_what_the_job_wrote_and_cleans_node_scratch",
    ],
    "sweep: 50 points → 50 results; --resubmit-failed reruns only the 3 failed": [
        "tests/integration/test_submit.py::test_a_50_point_sweep_ends_with_50_results_and_reruns_only_its_failed_points",
    ],
    "bad input: one line, exit 1, nothing changed (CLI table, init, submit; Hypothesis on every field)": [
        "tests/unit/test_bad_input.py",
        "tests/unit/test_init.py::test_bad_input_is_one_line_and_writes_nothing",
        "tests/integration/test_submit.py::test_bad_input_is_one_line_and_changes_nothing",
    ],
    "secrets: none in an image layer, SIF, script, ledger entry or log": [
        "tests/integration/test_submit.py::test_no_image_sif_script_ledger_or_log_holds_a_secret",
    ],
    "load: 20 concurrent submits → 20 jobs, each once in the ledger": [
        "tests/integration/test_submit.py::test_twenty_submits_at_once_leave_a_ledger_with_every_job",
    ],
}  # fmt: skip


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as directory:
        report = Path(directory) / "junit.xml"
        # Once each, and each file's tests together: pytest sets a module's fixtures up again for every
        # run of its tests the command line splits off (and the shared job folder is made only once).
        listed = dict.fromkeys(test for scenario in SCENARIOS.values() for test in scenario)
        tests = sorted(listed, key=lambda test: test.split("::")[0])
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *tests],
            cwd=REPO,
            check=False,
        )
        outcomes = _outcomes(report)
    rows = []
    for scenario, tests in SCENARIOS.items():
        mine = {name: ok for name, ok in outcomes.items() if any(_covers(test, name) for test in tests)}
        rows.append(
            {
                "metric": scenario,
                "value": f"{sum(mine.values())}/{len(mine)}",
                "unit": "checks held",
                "target": f"{len(mine)}/{len(mine)}",
                "note": ", ".join(sorted(name.split("::")[-1] for name, ok in mine.items() if not ok))
                or "all held",
            }
        )
    return rows


def _outcomes(report: Path) -> dict[str, bool]:
    """Test id (path::name[params]) → passed; a skip counts as not passed."""
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        outcomes[f"{path}::{case.get('name')}"] = not any(
            child.tag in ("failure", "error", "skipped") for child in case
        )
    return outcomes


def _covers(test: str, name: str) -> bool:
    """Whether a selection (a file, or file::test) covers the test id ``name`` (with its parameters)."""
    return name == test or name.startswith(f"{test}::") or name.startswith(f"{test}[")
