"""What `hpcbox status`, `logs`, `report`, `doctor` and `profile.draft` read from Slurm 26.05: real output of
a 26.05 mini cluster (tests/unit/data/report/slurm-26.05/, captured by capture.sh there; doctor.probes and
draft.probes are the two commands' own probe scripts run on its login node).

26.05 prints what hpcbox reads as 24.11 does: the same squeue and sacct lines (Restarts included),
`sinfo --version` as `slurm-wlm 26.05.5` (Debian's name), the same partitions and gres. What is new is
a second job identifier, the SLUID, which hpcbox does not need: a job keeps its number, and on the
cgroup v1 nodes here its cgroups are still named by it (`job_<id>`). Only cgroup/v2 keys them by SLUID
(a site's exporters meet that, not a job); a requeued job's runs each get a SLUID of their own.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hpcbox.jobs import follow
from hpcbox.minicluster import versions
from hpcbox.minicluster.lifecycle import UnfinishedJob, parse_unfinished
from hpcbox.minicluster.shape import slurm_like
from hpcbox.render import profiles
from hpcbox.report import efficiency
from hpcbox.survey import doctor, draft
from hpcbox.tools import slurm, ssh

DATA = Path(__file__).parent / "data" / "report" / "slurm-26.05"


# The forms capture.sh asked squeue and sacct for (hpcbox now also asks for each job's batch script).
CAPTURED_SQUEUE = "%i|%T|%r|%M|%l|%N"
CAPTURED_STATE = ("JobID", "State", "Reason", "Elapsed", "Timelimit", "ExitCode", "NodeList")


def text(name: str) -> str:
    return (DATA / name).read_text()


def rows(name: str) -> list[dict[str, str]]:
    return slurm.parse_sacct(text(f"{name}.sacct"), efficiency.SACCT_FIELDS)


def report(name: str) -> efficiency.Report:
    return efficiency.build_report(rows(name), None, None)


def figures(name: str) -> dict[str, efficiency.Figure]:
    return {figure.name: figure for figure in report(name).figures}


def test_the_captures_are_slurm_26_05s():
    assert text("version") == "slurm-wlm 26.05.5\n"
    assert versions.release(text("version").split()[-1]) == "26.05" and "26.05" in versions.SUITES


# --- sacct's fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["steps", "gpu-percpu", "running-gpu", "pending", "failed", "cancelled", "short", "timeout", "requeued",
     "gpus-nolimit", "memkill", "oom"],
)  # fmt: skip
def test_sacct_26_05_prints_every_field_of_the_report_restarts_included(name):
    found = rows(name)  # a line in another form would raise
    assert found and all(set(row) == set(efficiency.SACCT_FIELDS) for row in found)
    assert found[0]["Restarts"] == ("1" if name == "requeued" else "0")  # the allocation's line
    assert all(row["Restarts"] == "" for row in found[1:])  # its steps'


def test_a_requeued_jobs_runs_are_counted_by_sacct_itself_and_agree_with_its_duplicates():
    assert [(row["JobID"], row["Restarts"]) for row in rows("requeued")] == [("8", "1"), ("8.batch", "")]
    assert text("requeued.duplicates") == "8|REQUEUED\n8|COMPLETED\n"
    assert slurm.requeue_counts(text("requeued.duplicates")) == {"8": 1}
    assert figures("requeued")["time"].verdict == (
        "requeued 1 time, sacct shows the last run only: keep --time=00:05:00"
    )


class FakeConnection:
    """Answers sacct as 26.05 does: every field asked for, in one question."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def run(self, argv, *, what: str, check: bool = True, **_: object):
        from hpcbox.tools import proc

        self.asked.append(list(argv))
        return proc.Completed(tuple(argv), 0, text("requeued.sacct"), "")


def test_the_report_asks_sacct_once():
    connection = FakeConnection()
    found = slurm.sacct_rows(connection, "8", efficiency.SACCT_FIELDS)  # type: ignore[arg-type]
    assert len(connection.asked) == 1
    assert f"--format={','.join(efficiency.SACCT_FIELDS)}" in connection.asked[0]
    assert (found[0]["Restarts"], found[0]["State"]) == ("1", "COMPLETED")


# --- the report on each kind of job ---------------------------------------------------------------


def test_a_completed_job_is_sized_as_on_24_11():
    found = figures("steps")
    assert found["memory"].verdict == "asked 1G, peaked at 309.5M: ask for --mem=512M next time"
    assert found["time"].verdict == "ran 00:00:29 of 00:05:00: ask for --time=00:02:00"
    assert found["CPU"].value == "45% efficiency: 0.9 of 2 CPUs busy on average"


def test_memory_per_cpu_prints_as_the_jobs_total_as_on_24_11():
    assert rows("gpu-percpu")[0]["ReqMem"] == "1000M"  # --mem-per-cpu=500M x 2
    assert figures("gpu-percpu")["GPUs"].value == "1 asked"


def test_a_job_its_cgroup_killed_is_named_out_of_memory_as_on_24_11():
    # Nodes with cgroups (the mini cluster's on a cgroup v1 engine): the kernel kills it at the limit.
    built = report("oom")
    assert (built.state, built.exit_code) == ("OUT_OF_MEMORY", "0:125")
    assert built.cause == "out of memory at --mem=300M: ask for at least --mem=512M"
    memory = figures("oom")["memory"]
    assert memory.value == "reached the 300M asked (last sampled 4M: killed between samples)"


def test_a_job_slurms_accounting_killed_is_named_out_of_memory_as_on_24_11():
    # Nodes without cgroups (ClusterSpec(cgroups=False), an engine on cgroup v2): OverMemoryKill.
    built = report("memkill")
    assert (built.state, built.exit_code) == ("FAILED", "0:9")
    assert rows("memkill")[1]["State"] == "CANCELLED by 0"
    assert built.cause == (
        "out of memory (OUT_OF_MEMORY where cgroups enforce it): its peak of 492.9M passed --mem=300M "
        "and Slurm killed it; ask for at least --mem=640M"
    )


@pytest.mark.parametrize("name", ["failed", "cancelled", "timeout", "steps", "pending", "short", "requeued"])
def test_jobs_within_their_memory_were_not_killed_for_it(name):
    assert efficiency.memory_kill(rows(name)) is None
    assert report(name).cause == ""


def test_a_timeout_slurm_26_05_let_run_past_its_limit_asks_for_more_time():
    # 26.05 ended it 6 s after the limit (24.11 at it, 22.05 15 s after): read as killed at the limit.
    time = figures("timeout")["time"]
    assert time.value == "00:01:06 of 00:01:00 (110%)"
    assert time.verdict.startswith("killed at the 00:01:00 limit before finishing: ask for at least")


def test_a_job_without_a_limit_that_backfill_started_shows_a_years_limit():
    # 26.05's backfill scheduler gave the job with no --time (partition limit INFINITE) a limit of 365
    # days, where 22.05's capture of it shows UNLIMITED; one the main scheduler started (gpus-nolimit)
    # still shows UNLIMITED.
    assert [rows("short")[0][field] for field in ("Timelimit", "TimelimitRaw")] == ["365-00:00:00", "525600"]
    assert figures("short")["time"].value == "00:00:00 of 365-00:00:00 (0%)"
    assert figures("gpus-nolimit")["time"].value == "00:00:12, no time limit"


def test_pending_running_and_cancelled_jobs_say_what_is_not_known():
    assert figures("pending")["time"].verdict == "unknown: the job has not started"
    assert figures("running-gpu")["time"].value == "running for 00:00:14 of 00:10:00"
    cancelled = report("cancelled")
    assert cancelled.state == "CANCELLED by 1500"
    assert {f.name: f for f in cancelled.figures}["time"].verdict.startswith("stopped (CANCELLED by 1500)")


# --- status: squeue while Slurm holds the job, then sacct -------------------------------------------


def test_squeue_26_05_lines_are_read_as_24_11s():
    assert slurm.parse_squeue(text("pending.squeue"), "3", CAPTURED_SQUEUE) == slurm.JobState(
        "3", "PENDING", "Resources", "00:00:00", "00:05:00", "", "", "squeue"
    )
    running = slurm.parse_squeue(text("running.squeue"), "2", CAPTURED_SQUEUE)
    assert running is not None and (running.state, running.nodes, running.finished) == (
        "RUNNING",
        "node2",
        False,
    )
    done = slurm.parse_squeue(text("completed.squeue"), "2", CAPTURED_SQUEUE)
    assert done is not None and done.finished


@pytest.mark.parametrize(
    ("name", "job_id", "state", "exit_code"),
    [
        ("completed", "2", "COMPLETED", "0:0"),
        ("failed", "4", "FAILED", "3:0"),
        ("cancelled", "3", "CANCELLED", "0:0"),  # "CANCELLED by 1500", cut
        ("timeout", "9", "TIMEOUT", "0:0"),
        ("pending", "3", "PENDING", "0:0"),
    ],
)
def test_sacct_26_05_gives_each_ended_jobs_state_and_exit_code(name, job_id, state, exit_code):
    found = last_run(text(f"{name}.state"), job_id)
    assert found is not None and (found.state, found.exit_code, found.source) == (state, exit_code, "sacct")
    assert follow.describe(found).startswith(f"job {job_id}: {state}")


def test_an_arrays_tasks_while_pending_and_after():
    pending = slurm.parse_tasks(
        text("array-running.state"),
        text("array-running.squeue"),
        "10",
        fields=CAPTURED_STATE,
        squeue_format=CAPTURED_SQUEUE,
    )
    assert {index: task.state for index, task in pending.items()} == dict.fromkeys((1, 2, 3), "PENDING")
    done = slurm.parse_tasks(
        text("array-done.state"), "", "10", fields=CAPTURED_STATE, squeue_format=CAPTURED_SQUEUE
    )
    assert {index: (task.state, task.exit_code) for index, task in done.items()} == {
        1: ("COMPLETED", "0:0"), 2: ("FAILED", "1:0"), 3: ("COMPLETED", "0:0"),
    }  # fmt: skip
    overall = follow.array_state(done)
    assert overall is not None and (overall.state, overall.exit_code) == ("FAILED", "1:0")


def test_end_times_and_the_unfinished_jobs_a_replaced_cluster_would_lose():
    ends = slurm.parse_sacct(text("end.sacct"), ("JobID", "End"))
    assert ends[0] == {"JobID": "4", "End": "2026-11-28T12:38:29"}
    assert parse_unfinished(text("unfinished.squeue")) == (
        UnfinishedJob("10_[1-3]", "PENDING", "rpt-array"),
        UnfinishedJob("8", "PENDING", "rpt-requeue"),  # requeued: waiting for its next run
        UnfinishedJob("9", "RUNNING", "rpt-timeout"),
        UnfinishedJob("7", "RUNNING", "rpt-nolimit"),
    )


# --- the SLUID, 26.05's second job identifier -------------------------------------------------------


def test_a_job_keeps_its_number_and_its_cgroups_are_named_by_it_on_cgroup_v1():
    job = dict(re.findall(r"^(SLURM_JOB_\w+)=(\S+)$", text("sluid.job"), re.MULTILINE))
    assert job["SLURM_JOB_ID"] == "13" and re.fullmatch(r"s[0-9A-Z]{13}", job["SLURM_JOB_SLUID"]), job
    assert f"SLUID={job['SLURM_JOB_SLUID']}" in text("sluid.job")  # scontrol show job -d
    cgroups = [line.split(":", 2) for line in text("sluid.job").splitlines() if ":/slurm_" in line]
    assert {controller for _, controller, _ in cgroups} == {"freezer", "devices", "memory", "cpuset"}
    assert all(path.startswith("/slurm_node1/uid_1500/job_13/step_batch") for _, _, path in cgroups)
    assert job["SLURM_JOB_SLUID"] not in "".join(path for *_, path in cgroups)


def test_a_requeued_jobs_runs_each_have_a_sluid_of_their_own_and_one_job_id():
    found = slurm.parse_sacct(text("sluid.sacct"), ("JobID", "State", "SLUID", "OriginalSLUID"))
    runs = [row for row in found if row["JobID"] == "8"]
    assert [row["State"] for row in runs] == ["REQUEUED", "COMPLETED"]
    assert len({row["SLUID"] for row in runs}) == 2
    # What hpcbox keys a job by (its number) is the one the ledger has: one job, requeued once.
    projected = "".join(f"{row['JobID']}|{row['State']}\n" for row in found)
    assert slurm.requeue_counts(projected) == {"8": 1, "13": 0}


# --- doctor and profile.draft ---------------------------------------------------------------------


def test_the_doctor_reads_26_05s_login_node_and_names_its_version():
    probed = doctor.parse_probes(text("doctor.probes"))
    # Captured before the mini cluster had its preemptible partition: the profile it was made from then.
    shipped = profiles.load_profile("local")
    local = dataclasses.replace(
        shipped, partitions=tuple(p for p in shipped.partitions if p.name in ("cpu", "gpu"))
    )
    found = doctor.findings(dataclasses.replace(local, slurm_version="26.05"), probed)
    assert not doctor.failed(found)
    by_topic = {finding.topic: finding for finding in found if finding.topic != "partitions"}
    assert by_topic["slurm"].line().split() == ["ok", "slurm", "Slurm", "26.05.5"]
    assert by_topic["scheduler"].seen == "squeue and sacct answer (accounting on)"
    assert by_topic["accounts"].seen == "yours: research; QOS normal"
    partitions = [finding.seen for finding in found if finding.topic == "partitions"]
    assert partitions == ["cpu: no limit, gres gpu:2", "gpu: no limit, gres gpu:2"]
    # A profile naming the release the site left: the line to change.
    older = doctor.findings(dataclasses.replace(local, slurm_version="24.11"), probed)[0]
    assert (older.verdict, older.fix) == (doctor.DIFFERS, '[slurm] version = "26.05.5"')


def test_a_profile_drafted_from_26_05_is_rehearsed_on_26_05(tmp_path, monkeypatch):
    site = draft.read_site(doctor.parse_probes(text("draft.probes")), "login.example.edu")
    assert site.slurm_version == "26.05.5"
    assert [(p.name, p.default, p.max_time, p.nodes, p.gres) for p in site.partitions] == [
        ("cpu", True, None, 2, ("gpu:2", "gpu:2")),
        ("gpu", False, None, 2, ("gpu:2", "gpu:2")),
    ]
    assert (site.accounts, site.default_account, site.qos) == (("research",), "research", ("normal",))
    chosen, left_out = draft.choose(site, ())
    target = ssh.Target("login.example.edu", 2222, "someone")
    made = draft.compose(target, site, chosen, left_out, draft.Rules(False, False, False), None, today="d")
    assert '\n[slurm]\nversion = "26.05.5"  # sinfo --version\n' in made.text
    (tmp_path / "site26.toml").write_text(made.text)
    assert profiles.parse_profile_file(tmp_path / "site26.toml").slurm_version == "26.05.5"
    monkeypatch.setenv("HPCBOX_CLUSTERS_DIR", str(tmp_path))
    said: list[str] = []
    assert slurm_like("site26", say=said.append) == "26.05" and said == []  # its own release: no note


def last_run(text: str, job_id: str) -> slurm.JobState | None:
    runs = slurm.accounted_states(text, job_id, CAPTURED_STATE)
    return runs[-1] if runs else None
