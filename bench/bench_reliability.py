"""Reliability: every scenario of "jobs that lose nothing", run for real (mini cluster, Apptainer,
Slurm), each row its measured outcome. `invoke bench --name reliability` reruns them (about 25 min, one
after another); `python bench/bench_reliability.py --from-suite` reads them instead from the last full
suite run (bench/results/suite.json: every integration test's outcome, the run's commit and time).

Each scenario declares its checks: tests against the real mini cluster (no unit test with stand-in
commands counts here), each asserting the outcome (job states, results on shared storage, 0 bytes left
on every node's scratch, one-line refusals with nothing changed). A row's target is every declared
check; a check holds when its test ran and passed (every case of a parametrized one), so a test that
was skipped, failed or did not run at all is a check that did not hold.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SBATCH = "tests/integration/test_sbatch_cluster.py"
SUBMIT = "tests/integration/test_submit.py"
IDENTITY = "tests/integration/test_job_identity.py"

SCENARIOS = {
    "time limit (Slurm's USR1): checkpoint → requeue → resume, 1 and 2 nodes; --max-restarts bounds it": [
        f"{SBATCH}::test_time_limit_checkpoints_requeues_and_resumes",
        f"{SBATCH}::test_two_node_time_limit_checkpoints_requeues_and_resumes",
        f"{SBATCH}::test_a_job_requeued_max_restarts_times_stops_there_and_keeps_its_checkpoints",
    ],
    "USR1 sent by hand mid-training: requeued, completes with the figures of a run never stopped": [
        f"{SBATCH}::test_a_job_stopped_by_its_time_limit_signal_is_requeued_and_completes_as_if_never_stopped",
    ],
    "USR1 by hand to 2 nodes, one not in the rendezvous, a rank or a torchrun stopped: requeued, resumed": [
        f"{SBATCH}::test_two_nodes_signalled_while_one_is_not_yet_in_the_rendezvous_stop_together_and_requeue",
        f"{SBATCH}::test_two_nodes_with_a_rank_that_cannot_stop_end_in_time_and_resume_from_the_last_checkpoint",
        f"{SBATCH}::test_two_nodes_with_a_torchrun_that_cannot_stop_are_requeued_and_resume_from_the_last_checkpoint",
    ],
    "over its --mem, a spike too: OUT_OF_MEMORY by its cgroup (where the engine gives cgroups), no scratch": [
        "tests/integration/test_minicluster.py::test_a_job_over_its_memory_ends_out_of_memory_by_its_cgroup_or_failed_by_the_accounting",
        "tests/integration/test_minicluster.py::test_a_spike_freed_at_once_is_stopped_by_a_cgroup_where_sampling_may_miss_it",
        f"{SUBMIT}::test_a_job_over_its_memory_ends_out_of_memory_says_so_and_leaves_no_scratch",
    ],
    "GPUs it cannot use (cpu environment): refused before anything is sent, or stopped before it trains": [
        f"{SUBMIT}::test_a_gpu_job_in_the_cpu_environment_is_refused_or_stops_at_its_start",
        f"{SBATCH}::test_a_program_given_gpus_its_pytorch_cannot_use_does_not_start",
    ],
    "node killed mid-run: requeued, resumed on the other node from the periodic copy, completed": [
        "tests/integration/test_node_loss.py::test_a_dead_node_costs_the_job_only_what_it_did_since_its_last_copy",
    ],
    "accounting (slurmdbd) stops answering mid-job: never FAILED, logs and fetch work, status catches up": [
        "tests/integration/test_submit_faults.py::test_accounting_that_stops_answering_mid_job_never_makes_the_job_failed",
    ],
    "controller (slurmctld) restarted mid-job: the job completes with all its epochs": [
        "tests/integration/test_submit_faults.py::test_a_controller_restarted_mid_job_loses_nothing",
    ],
    "Ctrl-C while sbatch runs on the login node: the job recorded, then the command ends; Slurm runs it": [
        "tests/integration/test_submit_faults.py::"
        "test_a_ctrl_c_while_the_job_is_sent_leaves_it_recorded_not_running_unknown",
    ],
    "success, failure, cancel, timeout (1 and 2 nodes): results kept, 0 bytes left on any node's scratch": [
        f"{SBATCH}::test_local_script_runs_the_trainer_in_apptainer_and_cleans_up",
        f"{SBATCH}::test_failing_trainer_leaves_no_scratch_and_keeps_its_log",
        f"{SBATCH}::test_scancel_copies_back_what_the_trainer_wrote_and_cleans_up",
        f"{SBATCH}::test_two_nodes_train_one_ddp_run_in_apptainer",
        f"{SBATCH}::test_two_node_job_past_its_time_limit_keeps_its_output_and_leaves_no_scratch",
        f"{SUBMIT}::test_cancel_keeps_what_the_job_wrote_and_cleans_node_scratch",
    ],
    "sweep: 50 points → 50 results; --resubmit-failed reruns only the 3 failed": [
        f"{SUBMIT}::test_a_50_point_sweep_ends_with_50_results_and_reruns_only_its_failed_points",
    ],
    "login host silent, refusing the key or not listening: one line before any build, nothing recorded": [
        f"{SUBMIT}::test_unreachable_or_refusing_host_fails_fast_and_records_nothing",
    ],
    "a busy cluster: `up`, and the demo, beside a job on every node return while the jobs run on": [
        "tests/integration/test_minicluster.py::test_up_on_a_cluster_busy_on_every_node_returns_and_its_jobs_run_on",
        f"{SUBMIT}::test_demo_runs_the_whole_pipeline_from_a_clean_project",
    ],
    "a mini cluster made again: its job 1 beside the old job 1, neither's record nor results replaced": [
        f"{IDENTITY}::test_a_cluster_made_again_never_mixes_its_job_1_with_the_old_one",
    ],
    "a mini cluster whose containers stopped: `cluster.up` starts them again, jobs and results kept": [
        f"{IDENTITY}::test_a_cluster_whose_containers_stopped_comes_back_with_its_jobs_and_results",
    ],
    "a cancelled job resumed with --resume-from: the final figures of the same job never stopped": [
        f"{IDENTITY}::test_a_cancelled_job_resumed_from_ends_with_the_figures_of_a_run_never_stopped",
    ],
    "a sweep's failed points, its cluster made again: --resubmit-failed reruns exactly those": [
        f"{IDENTITY}::test_a_sweep_whose_cluster_was_made_again_reruns_exactly_its_failed_points",
    ],
    "an id Slurm gives again (controller rebuilt): the earlier job's folder kept, its commands its own": [
        f"{IDENTITY}::test_an_id_slurm_gives_again_is_never_taken_for_the_earlier_job",
    ],
    "a training and a submitit call preempted (no user signal: TERM at the grace time's end): resumed, "
    "figures and return of a run never stopped": [
        f"{SUBMIT}::test_a_preempted_job_resumes_and_ends_with_the_figures_of_a_run_never_stopped",
    ],
    "a training and a submitit call preempted where the site sends the user's signal: checkpointed as "
    "picked, resumed, figures and return of a run never stopped": [
        "tests/integration/test_rehearsal.py::"
        "test_a_call_and_a_training_picked_where_the_site_sends_the_users_signal_checkpoint_at_once_and_resume",
    ],
    "a two-node training preempted (no user signal: TERM to its steps at the pick): checkpointed then, "
    "requeued by Slurm, resumed from that checkpoint to its end": [
        f"{SUBMIT}::test_a_two_node_training_picked_checkpoints_is_requeued_and_resumes_from_that_checkpoint",
    ],
    "a two-node training preempted where the site sends the user's signal: checkpointed as picked, "
    "requeued by Slurm, resumed from that checkpoint to its end": [
        "tests/integration/test_rehearsal.py::"
        "test_a_two_node_training_picked_where_the_site_sends_the_users_signal_checkpoints_at_once_and_resumes",
    ],
    "a Hydra point preempted mid-run, then at its time limit: requeued each time, went on, returned": [
        "tests/integration/test_own_project.py::"
        "test_a_hydra_point_preempted_then_at_its_time_limit_is_requeued_each_time_resumes_and_returns",
    ],
    "a Hydra point picked where the site sends the user's signal: checkpointed as picked, went on, "
    "returned": [
        "tests/integration/test_own_project.py::"
        "test_a_hydra_point_picked_where_the_site_sends_the_users_signal_checkpoints_at_once_and_returns",
    ],
    "a race of two accounts, one at its limit: the free one's job kept, the other cancelled": [
        "tests/integration/test_rehearsal.py::test_a_race_of_two_accounts_keeps_the_free_ones_job_and_cancels_the_one_at_its_limit",
    ],
    "a finished job Slurm starts again (scontrol requeue): not run again, its results as they were": [
        f"{SBATCH}::test_a_finished_job_slurm_requeues_does_not_run_again_and_keeps_its_results",
    ],
    "an upload cut off: the next sends only what did not arrive, and the file is right": [
        "tests/integration/test_upload.py::test_an_interrupted_upload_sends_only_what_did_not_arrive",
    ],
    "the cluster's disk full: one line before anything is sent, nothing left": [
        f"{SUBMIT}::test_a_full_disk_on_the_cluster_stops_the_sif_upload_cleanly",
    ],
    "two uploads of one new file at once (threads, processes; the store's lock): one goes up; right SIF": [
        "tests/integration/test_upload.py::test_two_uploads_at_once_each_succeed_and_one_new_file_goes_up_once",
        "tests/integration/test_upload.py::test_two_processes_making_the_first_upload_of_one_file_send_it_once",
        "tests/integration/test_upload.py::test_a_tampered_or_unreadable_basis_still_gives_the_right_file",
    ],
    "bad input to submit: one line, exit 1, no entry, no job; a request Slurm refuses: no job, no entry": [
        f"{SUBMIT}::test_bad_input_is_one_line_and_changes_nothing",
        f"{SUBMIT}::test_sbatch_refusal_shows_slurms_message_and_records_nothing",
    ],
    "secrets: none in an image layer, SIF, script, ledger entry or log": [
        f"{SUBMIT}::test_no_image_sif_script_ledger_or_log_holds_a_secret",
    ],
    "load: 20 concurrent submits → 20 jobs, each once in the ledger": [
        f"{SUBMIT}::test_twenty_submits_at_once_leave_a_ledger_with_every_job",
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
    return _rows(outcomes)


def from_suite(suite: dict) -> list[dict]:
    """The rows from a full suite run's record: there every declared test ran against the same parts."""
    tests = suite["details"]["integration tests"]
    return _rows({test: each["outcome"] == "passed" for test, each in tests.items()})


def _rows(outcomes: dict[str, bool]) -> list[dict]:
    rows = []
    for scenario, tests in SCENARIOS.items():
        missed = [test for test in tests if not _held(test, outcomes)]
        rows.append(
            {
                "metric": scenario,
                "value": f"{len(tests) - len(missed)}/{len(tests)}",
                "unit": "checks held",
                "target": f"{len(tests)}/{len(tests)}",
                "note": "not held: " + ", ".join(test.split("::")[-1] for test in missed)
                if missed
                else "all held",
                "checks": {test.split("::")[-1]: _held(test, outcomes) for test in tests},
            }
        )
    return rows


def _held(test: str, outcomes: dict[str, bool]) -> bool:
    """A declared check held: its test ran, and every case of it passed."""
    cases = [passed for name, passed in outcomes.items() if _covers(test, name)]
    return bool(cases) and all(cases)


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


if __name__ == "__main__":
    if sys.argv[1:] != ["--from-suite"]:
        sys.exit("usage: python bench/bench_reliability.py --from-suite")
    import run as runner  # beside this file, where Python finds a script's neighbours

    recorded = json.loads((REPO / "bench/results/suite.json").read_text())
    started = datetime.datetime.fromisoformat(recorded["started"])
    runner.record("reliability", started, from_suite(recorded), commit=recorded["commit"])
