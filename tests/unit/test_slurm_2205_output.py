"""What `hpcbox status`, `logs` and `report` read from Slurm 22.05: real squeue and sacct output of a
22.05 mini cluster (tests/unit/data/report/slurm-22.05/, captured by capture.sh there).

The one difference from 24.11 that matters: sacct 22.05 has no Restarts field (Slurm 23.02 added it)
and refuses to print anything when asked for it. hpcbox asks again without it, and counts a requeued
job's runs from `sacct --duplicates` instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbox.jobs import follow
from hpcbox.minicluster.lifecycle import UnfinishedJob, parse_unfinished
from hpcbox.report import efficiency
from hpcbox.tools import proc, slurm

DATA = Path(__file__).parent / "data" / "report" / "slurm-22.05"
OLDER = ("Restarts",)  # what sacct 22.05 does not know of report.SACCT_FIELDS
REFUSED = 'sacct: error: Invalid field requested: "Restarts"\n'  # its whole answer, exit status 1


# The forms capture.sh asked squeue and sacct for (hpcbox now also asks for each job's batch script).
CAPTURED_SQUEUE = "%i|%T|%r|%M|%l|%N"
CAPTURED_STATE = ("JobID", "State", "Reason", "Elapsed", "Timelimit", "ExitCode", "NodeList")


def text(name: str) -> str:
    return (DATA / name).read_text()


def rows(name: str, runs: str = "") -> list[dict[str, str]]:
    return slurm.older_sacct_rows(text(f"{name}.sacct"), efficiency.SACCT_FIELDS, OLDER, runs)


def report(name: str, runs: str = "") -> efficiency.Report:
    return efficiency.build_report(rows(name, runs), None, None)


def test_the_captures_are_slurm_22_05s():
    assert text("version") == "slurm-wlm 22.05.8\n"


# --- sacct's fields -------------------------------------------------------------------------------


def test_sacct_22_05_names_the_field_it_does_not_know():
    assert slurm.unknown_field(REFUSED, efficiency.SACCT_FIELDS) == "Restarts"
    assert slurm.unknown_field(REFUSED, ("JobID", "State")) is None  # not one hpcbox asked for
    assert slurm.unknown_field("sacct: error: Problem talking to the database\n", ("Restarts",)) is None


def test_its_output_without_restarts_has_every_field_of_the_report():
    found = rows("steps")
    assert [row["JobID"] for row in found] == ["14", "14.batch", "14.0"]
    assert all(set(row) == set(efficiency.SACCT_FIELDS) for row in found)
    assert [row["Restarts"] for row in found] == ["", "", ""]  # not counted: unknown, not 0
    assert [row["MaxRSS"] for row in found] == ["", "112664K", "315992K"]
    assert found[0]["ReqMem"] == "1G" and found[0]["AllocTRES"] == "billing=2,cpu=2,mem=1G,node=1"
    # As 24.11's: a line of 22 fields is refused when all 23 were asked for.
    with pytest.raises(ValueError, match="expected 23"):
        slurm.parse_sacct(text("steps.sacct"), efficiency.SACCT_FIELDS)


def test_a_requeued_jobs_runs_are_counted_from_sacct_duplicates():
    assert text("requeued.duplicates") == "21|REQUEUED\n21|COMPLETED\n"
    assert slurm.requeue_counts(text("requeued.duplicates")) == {"21": 1}
    counted = rows("requeued", text("requeued.duplicates"))
    assert [(row["JobID"], row["Restarts"]) for row in counted] == [("21", "1"), ("21.batch", "")]
    time = {f.name: f for f in report("requeued", text("requeued.duplicates")).figures}["time"]
    assert time.verdict == "requeued 1 time, sacct shows the last run only: keep --time=00:05:00"
    # An older job that had the same id (a cluster whose numbering began again) is no run of this one.
    assert slurm.requeue_counts("21|COMPLETED\n21|REQUEUED\n21|COMPLETED\n") == {"21": 1}


class FakeConnection:
    """Answers sacct as 22.05 does: refuses Restarts, else prints the captured lines."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def run(self, argv, *, what: str, check: bool = True, **_: object) -> proc.Completed:
        fields = next(word for word in argv if word.startswith("--format=")).removeprefix("--format=")
        self.asked.append(fields)
        if "Restarts" in fields.split(","):
            return proc.Completed(tuple(argv), 1, "", REFUSED)
        if "--duplicates" in argv:
            return proc.Completed(tuple(argv), 0, text("requeued.duplicates"), "")
        return proc.Completed(tuple(argv), 0, text("requeued.sacct"), "")


def test_the_report_asks_again_without_the_field_and_counts_the_runs():
    connection = FakeConnection()
    found = slurm.sacct_rows(connection, "21", efficiency.SACCT_FIELDS)  # type: ignore[arg-type]
    without = ",".join(field for field in efficiency.SACCT_FIELDS if field != "Restarts")
    assert connection.asked == [",".join(efficiency.SACCT_FIELDS), without, "JobID,State"]
    assert found[0]["Restarts"] == "1" and found[0]["State"] == "COMPLETED"


# --- the report on each kind of job ---------------------------------------------------------------


def test_a_completed_job_is_sized_as_on_24_11():
    figures = {f.name: f for f in report("steps").figures}
    assert figures["memory"].verdict == "asked 1G, peaked at 308.6M: ask for --mem=512M next time"
    assert figures["time"].verdict == "ran 00:00:29 of 00:05:00: ask for --time=00:02:00"
    assert figures["CPU"].value == "26% efficiency: 0.5 of 2 CPUs busy on average"


def test_memory_per_cpu_prints_as_the_jobs_total_as_on_24_11():
    found = rows("gpu-percpu")
    assert found[0]["ReqMem"] == "1000M"  # --mem-per-cpu=500M x 2: no c/n suffix since 21.08
    assert efficiency.parse_req_mem("1000M", 2, 1) == efficiency.MemoryRequest(1000 * 2**20, "job")
    gpus = {f.name: f for f in report("gpu-percpu").figures}["GPUs"]
    assert gpus.value == "1 asked"


def test_a_job_killed_for_memory_is_named_out_of_memory():
    built = report("memkill")
    assert (built.state, built.exit_code) == ("FAILED", "0:9")
    assert built.cause == (
        "out of memory (OUT_OF_MEMORY where cgroups enforce it): its peak of 391.2M passed --mem=300M "
        "and Slurm killed it; ask for at least --mem=512M"
    )


def test_a_job_its_cgroup_killed_is_named_out_of_memory_as_on_24_11():
    # The same job on 22.05 nodes enforcing with cgroups: OUT_OF_MEMORY 0:125, below any sample.
    built = report("oom")
    assert (built.state, built.exit_code) == ("OUT_OF_MEMORY", "0:125")
    assert built.cause == "out of memory at --mem=300M: ask for at least --mem=512M"
    memory = {f.name: f for f in built.figures}["memory"]
    assert memory.value == "reached the 300M asked (last sampled 3.5M: killed between samples)"


@pytest.mark.parametrize("name", ["failed", "cancelled", "timeout", "steps", "pending", "short", "requeued"])
def test_jobs_within_their_memory_were_not_killed_for_it(name):
    assert efficiency.memory_kill(rows(name)) is None
    assert report(name).cause == ""


def test_a_timeout_slurm_22_05_let_run_past_its_limit_asks_for_more_time():
    # 22.05 ended it 15 s after the limit (24.11 at it): the report reads that as killed at the limit.
    time = {f.name: f for f in report("timeout").figures}["time"]
    assert time.value == "00:01:15 of 00:01:00 (125%)"
    assert time.verdict.startswith("killed at the 00:01:00 limit before finishing: ask for at least")


def test_pending_running_and_cancelled_jobs_say_what_is_not_known():
    pending = {f.name: f for f in report("pending").figures}
    assert pending["time"].verdict == "unknown: the job has not started"
    running = {f.name: f for f in report("running-gpu").figures}
    assert running["time"].value == "running for 00:00:13 of 00:10:00"
    cancelled = report("cancelled")
    assert cancelled.state == "CANCELLED by 1500"
    assert {f.name: f for f in cancelled.figures}["time"].verdict.startswith("stopped (CANCELLED by 1500)")
    assert report("gpus-nolimit").figures[2].value == "00:00:12, no time limit"


# --- status: squeue while Slurm holds the job, then sacct -------------------------------------------


def test_squeue_22_05_lines_are_read_as_24_11s():
    assert slurm.parse_squeue(text("pending.squeue"), "16", CAPTURED_SQUEUE) == slurm.JobState(
        "16", "PENDING", "Resources", "00:00:00", "00:05:00", "", "", "squeue"
    )
    running = slurm.parse_squeue(text("running.squeue"), "15", CAPTURED_SQUEUE)
    assert running is not None and (running.state, running.nodes, running.finished) == (
        "RUNNING",
        "node2",
        False,
    )
    done = slurm.parse_squeue(text("completed.squeue"), "15", CAPTURED_SQUEUE)
    assert done is not None and done.finished


@pytest.mark.parametrize(
    ("name", "job_id", "state", "exit_code"),
    [
        ("completed", "15", "COMPLETED", "0:0"),
        ("failed", "17", "FAILED", "3:0"),
        ("cancelled", "16", "CANCELLED", "0:0"),  # "CANCELLED by 1500", cut
        ("timeout", "22", "TIMEOUT", "0:0"),
        ("pending", "16", "PENDING", "0:0"),
    ],
)
def test_sacct_22_05_gives_each_ended_jobs_state_and_exit_code(name, job_id, state, exit_code):
    found = last_run(text(f"{name}.state"), job_id)
    assert found is not None and (found.state, found.exit_code, found.source) == (state, exit_code, "sacct")


def test_an_arrays_tasks_while_pending_and_after():
    pending = slurm.parse_tasks(
        text("array-running.state"),
        text("array-running.squeue"),
        "23",
        fields=CAPTURED_STATE,
        squeue_format=CAPTURED_SQUEUE,
    )
    assert {index: task.state for index, task in pending.items()} == {
        1: "PENDING",
        2: "PENDING",
        3: "PENDING",
    }
    done = slurm.parse_tasks(
        text("array-done.state"), "", "23", fields=CAPTURED_STATE, squeue_format=CAPTURED_SQUEUE
    )
    assert {index: (task.state, task.exit_code) for index, task in done.items()} == {
        1: ("COMPLETED", "0:0"), 2: ("FAILED", "1:0"), 3: ("COMPLETED", "0:0"),
    }  # fmt: skip
    overall = follow.array_state(done)
    assert overall is not None and (overall.state, overall.exit_code) == ("FAILED", "1:0")


def test_end_times_and_the_unfinished_jobs_a_replaced_cluster_would_lose():
    ends = slurm.parse_sacct(text("end.sacct"), ("JobID", "End"))
    assert ends[0] == {"JobID": "17", "End": "2026-11-26T03:41:03"}
    unfinished = parse_unfinished(text("unfinished.squeue"))
    assert unfinished == (
        UnfinishedJob("21", "PENDING", "rpt-requeue"),  # requeued: waiting for its next run
        UnfinishedJob("23_[1-3]", "PENDING", "rpt-array"),
        UnfinishedJob("22", "RUNNING", "rpt-timeout"),
        UnfinishedJob("20", "RUNNING", "rpt-nolimit"),
    )


def last_run(text: str, job_id: str) -> slurm.JobState | None:
    runs = slurm.accounted_states(text, job_id, CAPTURED_STATE)
    return runs[-1] if runs else None
