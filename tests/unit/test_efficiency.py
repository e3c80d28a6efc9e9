"""The job efficiency report, on sacct output and trainer metrics captured from real runs.

tests/unit/data/report/README.md says how each input was made. The GPU CSVs are hand-made samples in
nvidia-smi's CSV format (the capture machine has no GPU); everything else is real output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcbox import units
from hpcbox.report import efficiency
from hpcbox.report.efficiency import Figure
from hpcbox.tools import slurm

DATA = Path(__file__).parent / "data" / "report"


def sacct(name: str) -> list[dict[str, str]]:
    return slurm.parse_sacct((DATA / f"{name}.sacct").read_text(), efficiency.SACCT_FIELDS)


def figures(name: str, metrics: Path | None = None, gpu_csv: Path | None = None) -> dict[str, Figure]:
    built = efficiency.build_report(sacct(name), metrics, gpu_csv)
    return {figure.name: figure for figure in built.figures}


# -- parsing -----------------------------------------------------------------------------------------


def test_parse_sacct_reads_the_job_line_and_each_step():
    rows = sacct("steps")
    assert [row["JobID"] for row in rows] == ["1", "1.batch", "1.0"]
    assert rows[0]["State"] == "COMPLETED"
    assert rows[0]["AllocTRES"] == "billing=2,cpu=2,mem=1G,node=1"
    assert [row["MaxRSS"] for row in rows] == ["", "114264K", "316008K"]


def test_parse_sacct_rejects_output_in_another_format():
    with pytest.raises(ValueError, match="expected 23"):
        slurm.parse_sacct("1|job|COMPLETED\n", efficiency.SACCT_FIELDS)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("316008K", 316008 * 1024),
        ("1000M", 1000 * 1024**2),
        ("3.1G", round(3.1 * 1024**3)),
        ("2T", 2 * 1024**4),
        ("0", 0),
    ],
)
def test_parse_size_knows_slurms_binary_units(text, size):
    assert units.parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "ncpus", "nnodes", "per_node", "form"),
    [
        ("500Mc", 2, 1, 1000 * 1024**2, "cpu"),  # per CPU: times the CPUs of a node
        ("500Mc", 8, 2, 2000 * 1024**2, "cpu"),
        ("1Gn", 4, 2, 1024**3, "node"),  # per node, as it stands
        ("64Gn", 8, 1, 64 * 1024**3, "node"),
        ("1000M", 2, 1, 1000 * 1024**2, "job"),  # Slurm 21.08+: the job's total over its nodes
        ("2G", 2, 2, 1024**3, "job"),
        ("16000", 4, 1, 16000 * 1024**2, "job"),  # no unit: Slurm's default, megabytes
        ("0n", 4, 1, 0, "node"),  # --mem=0, the whole node
    ],
)
def test_parse_req_mem_resolves_every_form_to_bytes_per_node(text, ncpus, nnodes, per_node, form):
    assert efficiency.parse_req_mem(text, ncpus, nnodes) == efficiency.MemoryRequest(per_node, form)


@pytest.mark.parametrize("text", ["", "lots", "1Gx", "-1G"])
def test_parse_req_mem_rejects_what_slurm_never_prints(text):
    with pytest.raises(ValueError):
        efficiency.parse_req_mem(text, 1, 1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:28.115", 28.115),
        ("00:00.002", 0.002),
        ("12:03.500", 723.5),
        ("01:02:03", 3723),
        ("1-02:03:04", 93784),
    ],
)
def test_parse_cpu_time_reads_each_of_saccts_forms(text, seconds):
    assert units.parse_cpu_time(text) == pytest.approx(seconds)


def test_sizes_print_as_slurm_prints_them():
    assert units.format_size(316008 * 1024) == "308.6M"
    assert units.format_size(3.1 * 1024**3) == "3.1G"
    assert units.format_request(1000 * 1024**2) == "1000M"
    assert units.format_request(2 * 1024**3) == "2G"


def test_requests_round_up_with_headroom_to_sizes_people_ask_for():
    assert units.format_request(efficiency.suggest_mem(3.1 * 1024**3)) == "4G"  # 3.9G
    assert units.format_request(efficiency.suggest_mem(300 * 1024**2)) == "384M"
    assert units.format_request(efficiency.suggest_mem(40 * 1024**3)) == "52G"
    # The limit leaves headroom after the checkpoint signal too (60 s before the end for short limits).
    assert efficiency.suggest_time(28) == 120
    assert (
        efficiency.suggest_time(7 * 60) == 10 * 60
    )  # 8.75 min of need: 9 min would leave 8 before the signal
    assert efficiency.suggest_time(50 * 60) == 75 * 60  # 62.5 min, to the quarter hour


# -- verdicts for the captured jobs ------------------------------------------------------------------


def test_cpu_efficiency_is_seffs_total_cpu_over_elapsed_times_cpus():
    cpu = figures("steps")["CPU"]
    assert cpu.value == "50% efficiency: 1.0 of 2 CPUs busy on average"  # 28.115 s / (28 s x 2)
    assert cpu.verdict == "used 1.0 of 2 CPUs: ask for 1"


def test_a_job_that_kept_its_cpu_busy_fits_its_request():
    assert figures("failed")["CPU"].verdict == "used 0.5 of 1 CPUs: the request fits"


def test_cpu_time_past_the_elapsed_seconds_is_all_cpus_within_saccts_resolution():
    # Hand-made from steps.sacct (its real figures: 2 CPUs): a bound job's 6.5 s of CPU on one CPU
    # in a run sacct counts as 6 s, as the demo's on the enforcing mini cluster.
    rows = sacct("steps")
    rows[0].update(NCPUS="1", ElapsedRaw="6", TotalCPU="00:06.505")
    cpu = efficiency.cpu_figure(rows[0], None)
    assert (
        cpu.value
        == "100% efficiency: 1.0 of 1 CPUs busy on average (6.5 s of CPU in what sacct counts as 6 s)"
    )
    assert cpu.verdict == "used 1.0 of 1 CPUs: the request fits"


def test_cpu_beyond_what_was_given_asks_for_the_cpus_it_used():
    # Hand-made: 12 s of CPU in 6 s on one CPU, where nothing bound the job to it.
    rows = sacct("steps")
    rows[0].update(NCPUS="1", ElapsedRaw="6", TotalCPU="00:12.000")
    cpu = efficiency.cpu_figure(rows[0], None)
    assert cpu.value == "200% efficiency: 2.0 of 1 CPUs busy on average"
    assert cpu.verdict == (
        "used 2.0 of 1 CPUs, more than it was given (nothing bound it to them here; a site that binds "
        "tasks slows it down): ask for 2"
    )


def test_memory_peak_is_the_largest_maxrss_of_any_step():
    memory = figures("steps")["memory"]
    assert memory.value == "peak 308.6M of 1G asked (30%)"  # step .0's 316008K, not .batch's
    assert memory.verdict == "asked 1G, peaked at 308.6M: ask for --mem=512M next time"


@pytest.mark.parametrize(
    ("asked", "verdict"),
    [
        ("384M", "asked 384M, peaked at 308.6M, too close to the limit: ask for --mem=512M"),
        ("512M", "asked 512M, peaked at 308.6M: the request fits"),
        # One size step over the 512M needed is not worth a change; 768M is (512M is 2/3 of it).
        ("640M", "asked 640M, peaked at 308.6M: the request fits"),
        ("768M", "asked 768M, peaked at 308.6M: ask for --mem=512M next time"),
    ],
)
def test_memory_asked_near_what_is_needed_fits(asked, verdict):
    # Hand-made from steps.sacct: the same run, as if it had asked for other sizes.
    rows = sacct("steps")
    rows[0]["ReqMem"] = asked
    memory = {f.name: f for f in efficiency.build_report(rows, None, None).figures}["memory"]
    assert memory.verdict == verdict


def test_memory_per_cpu_request_counts_every_cpu():
    memory = figures("gpu-percpu")["memory"]
    assert memory.value == "peak 418.2M of 1000M asked (42%)"
    assert memory.verdict == "asked 1000M, peaked at 418.2M: ask for --mem=640M next time"


def test_memory_per_cpu_in_the_older_form_is_named():
    rows = sacct("gpu-percpu")
    rows[0]["ReqMem"] = "500Mc"  # how Slurm before 21.08 printed the same request
    memory = {f.name: f for f in efficiency.build_report(rows, None, None).figures}["memory"]
    assert memory.value == "peak 418.2M of 1000M asked (500M per CPU) (42%)"


def test_memory_of_a_job_that_stopped_early_is_a_lower_bound():
    memory = figures("failed")["memory"]
    assert memory.verdict == "asked 1G, peaked at 60M before it stopped (FAILED): ask for at least --mem=128M"


def test_a_job_slurm_killed_for_its_memory_is_named_out_of_memory_with_the_mem_to_ask():
    # Slurm's accounting kill (the mini cluster's, and sites' without cgroups) ends the job FAILED
    # 0:9 with its batch step CANCELLED by root: only the peak past --mem tells it from a cancel.
    built = efficiency.build_report(sacct("memkill"), None, None)
    memory = {f.name: f for f in built.figures}["memory"]
    assert memory.value == "peak 390.2M of 300M asked (130%)"
    # The peak it was killed at, plus headroom: 390.2M x 1.25 rounds up to 512M.
    assert memory.verdict == "ran out of memory at 300M: ask for at least --mem=512M"
    assert built.state == "FAILED"
    assert built.cause == (
        "out of memory (OUT_OF_MEMORY where cgroups enforce it): its peak of 390.2M passed --mem=300M "
        "and Slurm killed it; ask for at least --mem=512M"
    )
    heading = efficiency.format_report(built).splitlines()[0]
    assert heading == f"job 3 (wrap): FAILED, exit code 0:9: {built.cause}"


def test_a_cgroups_out_of_memory_is_named_even_below_the_sampled_peak():
    # Hand-made from memkill.sacct: a cgroup kills at the limit itself, between accounting samples.
    rows = sacct("memkill")
    rows[0]["State"], rows[1]["State"], rows[1]["MaxRSS"] = "OUT_OF_MEMORY", "OUT_OF_MEMORY", "250M"
    killed = efficiency.memory_kill(rows)
    assert killed == efficiency.MemoryKill(asked=300 * 2**20, peak=250 * 2**20, by_accounting=False)
    # The limit plus headroom (375M), plus headroom again as for any peak: 512M.
    assert killed.in_words() == "out of memory at --mem=300M: ask for at least --mem=512M"


def test_a_job_its_cgroup_killed_at_the_limit_is_named_out_of_memory_though_no_sample_saw_it():
    # Real, from the mini cluster's cgroups (a cgroup site's ending): the kernel killed burn.py at
    # --mem=300M before any accounting sample saw more than 4M, and Slurm ended it OUT_OF_MEMORY.
    built = efficiency.build_report(sacct("oom"), None, None)
    assert (built.state, built.exit_code) == ("OUT_OF_MEMORY", "0:125")
    memory = {f.name: f for f in built.figures}["memory"]
    assert memory.value == "reached the 300M asked (last sampled 3.9M: killed between samples)"
    assert memory.verdict == "ran out of memory at 300M: ask for at least --mem=512M"
    assert built.cause == "out of memory at --mem=300M: ask for at least --mem=512M"
    heading = efficiency.format_report(built).splitlines()[0]
    assert heading == f"job 1 (rpt-oom): OUT_OF_MEMORY, exit code 0:125: {built.cause}"


def test_a_cgroups_out_of_memory_with_no_maxrss_at_all_is_still_named():
    # Hand-made from oom.sacct: no sample at all (a job shorter than one), where the report would
    # otherwise say the peak is unknown.
    rows = sacct("oom")
    rows[1]["MaxRSS"] = ""
    built = efficiency.build_report(rows, None, None)
    memory = {f.name: f for f in built.figures}["memory"]
    assert memory.value == "reached the 300M asked (no sample recorded: killed between samples)"
    assert memory.verdict == "ran out of memory at 300M: ask for at least --mem=512M"
    assert built.cause == "out of memory at --mem=300M: ask for at least --mem=512M"


@pytest.mark.parametrize("name", ["failed", "cancelled", "timeout", "steps", "pending", "short"])
def test_jobs_that_stayed_within_their_memory_were_not_killed_for_it(name):
    assert efficiency.memory_kill(sacct(name)) is None
    assert efficiency.build_report(sacct(name), None, None).cause == ""


def test_time_suggests_a_limit_with_headroom():
    time = figures("steps")["time"]
    assert time.value == "00:00:28 of 00:05:00 (9%)"
    assert time.verdict == "ran 00:00:28 of 00:05:00: ask for --time=00:02:00"


def test_time_after_a_timeout_asks_for_more():
    time = figures("timeout")["time"]
    assert time.value == "00:01:00 of 00:01:00 (100%)"
    assert time.verdict == (
        "killed at the 00:01:00 limit before finishing: ask for at least --time=00:03:00, "
        "or checkpoint and requeue"
    )


def test_time_of_a_requeued_job_keeps_its_limit():
    # sacct shows only the last run (30 s); earlier runs may have used the whole limit.
    time = figures("requeued")["time"]
    assert time.verdict == "requeued 1 time, sacct shows the last run only: keep --time=00:05:00"


def test_time_of_a_cancelled_job_gives_no_smaller_limit():
    time = figures("cancelled")["time"]
    assert time.value == "00:01:49 of 00:05:00 (36%)"
    assert (
        time.verdict
        == "stopped (CANCELLED by 1500) after 00:01:49: no full run to size it from, keep 00:05:00"
    )


def test_a_run_cancelled_before_its_last_epoch_is_told_the_command_that_resumes_it(tmp_path):
    """Issue 59: the advice was "rerun to resume", and a rerun started again at epoch 1; its --time came
    from the cancelled run's elapsed time. Now: the command that resumes it, with a limit for the epochs
    left, and the limit a whole run needs from its epochs' time."""
    lines = []
    for line in (DATA / "metrics-2epochs.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "done":
            continue  # cancelled after its second epoch of 10
        if record["event"] == "epoch":
            record["epochs"] = 10
        lines.append(json.dumps(record))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(lines) + "\n")
    resume = "hpcbox submit --cluster=local --resume-from 7"
    built = efficiency.build_report(sacct("cancelled"), metrics, None, resume=resume)
    found = {figure.name: figure for figure in built.figures}
    # (8.6381 + 12.3425) / 2 = 10.49 s an epoch: 8 left take 83.9 s, all 10 take 104.9 s.
    assert found["throughput"].verdict == (
        f"stopped after 2 of 10 epochs: resume from its last checkpoint: `{resume} --time=00:03:00`"
    )
    assert found["time"].verdict == (
        "stopped (CANCELLED by 1500) after 00:01:49; its 10 epochs at 10.5 s each take about 00:01:45: "
        "a whole run needs --time=00:04:00"
    )
    # With no time limit (the mini cluster's partitions), the same sizing, not one from its 1:49.
    unlimited = [{**row, "Timelimit": "UNLIMITED", "TimelimitRaw": "UNLIMITED"} for row in sacct("cancelled")]
    time = {f.name: f for f in efficiency.build_report(unlimited, metrics, None, resume=resume).figures}[
        "time"
    ]
    assert (time.value, time.verdict.split("; ")[1]) == (
        "00:01:49, no time limit",
        "its 10 epochs at 10.5 s each take about 00:01:45: a whole run needs --time=00:04:00",
    )


def test_time_without_a_limit_suggests_one():
    time = figures("gpus-nolimit")["time"]
    assert time.value == "00:00:12, no time limit"
    assert time.verdict == "ask for --time=00:02:00: jobs with a short limit start sooner"


def test_memory_asked_as_the_whole_node_is_still_sized():
    memory = figures("gpus-nolimit")["memory"]  # --mem=0: sacct 24.11 prints the node's 2000M
    assert memory.verdict == "asked 2000M, peaked at 160.2M: ask for --mem=256M next time"


# -- GPUs --------------------------------------------------------------------------------------------


def test_gpus_asked_without_samples_are_unknown_never_invented():
    gpus = figures("gpu-percpu")["GPUs"]
    assert gpus == Figure("GPUs", "1 asked", "unknown: no GPU samples (nvidia-smi not on the node)")


def test_no_gpus_asked_is_one_line():
    assert figures("steps")["GPUs"] == Figure("GPUs", "none asked", "a CPU-only job: nothing to check")


def test_gpu_samples_give_mean_utilisation_and_peak_memory_per_gpu():
    gpus = figures("gpus-nolimit", gpu_csv=DATA / "gpu-2gpus.csv")["GPUs"]
    assert gpus.value == "GPU 0: 90% busy, peak 12.5G of 80G; GPU 1: 0% busy, peak 4M of 80G"
    assert gpus.verdict == "asked for 2 GPUs, 1 did any work: ask for 1"


def test_a_starved_gpu_points_at_the_input_pipeline():
    gpus = figures("gpu-percpu", gpu_csv=DATA / "gpu-starved.csv")["GPUs"]
    assert gpus.value == "GPU 0: 29% busy, peak 3.5G of 40G"
    assert gpus.verdict.startswith("busy 29% on average: the GPUs wait for input")


def test_gpu_samples_without_units_and_across_a_requeue(tmp_path):
    # The trainer's own sampler writes `--format=csv,nounits` with power.draw, appending on a requeue.
    header = "timestamp, index, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
    header += "memory.total [MiB], power.draw [W]"
    csv = tmp_path / "gpu-node1.csv"
    csv.write_text(
        f"{header}\n2026/11/23 10:00:00.000, 0, 80, 30, 2048, 16384, 200.00\n"
        f"{header}\n2026/11/23 10:05:00.000, 0, 60, 30, 4096, 16384, [N/A]\n"
    )
    gpus = figures("gpu-percpu", gpu_csv=csv)["GPUs"]
    assert gpus.value == "GPU 0: 70% busy, peak 4G of 16G"
    assert gpus.verdict == "busy 70% on average: well used"


def test_a_gpu_file_holding_only_an_error_is_unknown(tmp_path):
    csv = tmp_path / "gpu-utilization.csv"
    csv.write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    gpus = figures("gpu-percpu", gpu_csv=csv)["GPUs"]
    assert gpus.verdict == (
        "unknown: no GPU samples in gpu-utilization.csv "
        "(NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)"
    )


# -- training throughput -----------------------------------------------------------------------------


def test_throughput_from_the_trainers_epoch_lines():
    found = figures("steps", DATA / "metrics-2epochs.jsonl")
    # (8.6381 + 12.3425) / 2 s per epoch; 2 x 1280 samples in 19.9 s of training; 0.24 s waiting for data.
    assert found["throughput"] == Figure(
        "throughput", "2 of 2 epochs, 10.5 s per epoch, 129 samples/s", "finished all 2 epochs"
    )
    assert found["data wait"] == Figure(
        "data wait", "1% of training time waiting for the next batch", "under 25%: the loader keeps up"
    )


def test_throughput_counts_the_restarts_of_a_requeued_run():
    throughput = figures("requeued", DATA / "metrics-requeued.jsonl")["throughput"]
    # Epoch 1 was resumed at step 17, so only epoch 2's 12.5 s is a whole epoch's time.
    assert throughput.value == "2 of 2 epochs, resumed 1 time, 12.5 s per epoch, 97 samples/s"
    assert (
        throughput.verdict == "finished all 2 epochs after being stopped 1 time and resumed from checkpoints"
    )


def test_a_stopped_run_says_why_and_the_time_it_lost_between_checkpoint_and_resume():
    metrics = DATA / "metrics-requeued.jsonl"
    # Its checkpoint at 1795413645.907 (the `preempted` line), its next start at 1795413660.57.
    at_limit = figures("requeued", metrics)["stops"]
    assert at_limit == Figure(
        "stops",
        "stopped 1 time, at its time limit",
        "00:00:15 lost between checkpoint and resume (copying back, waiting to run again, starting again)",
    )
    rows = sacct("requeued")
    preempted = {f.name: f for f in efficiency.build_report(rows, metrics, None, preempted_runs=2).figures}
    assert (
        preempted["stops"].value
        == "stopped 1 time, preempted by Slurm (2 earlier runs PREEMPTED in accounting)"
    )
    assert preempted["stops"].verdict == at_limit.verdict
    unmeasured = {f.name: f for f in efficiency.build_report(rows, None, None, preempted_runs=1).figures}
    assert unmeasured["stops"] == Figure(
        "stops",
        "requeued, preempted by Slurm (1 earlier run PREEMPTED in accounting)",
        "unknown: no metrics.jsonl to say how long it was stopped",
    )
    assert "stops" not in figures("steps", DATA / "metrics-2epochs.jsonl")


def test_a_data_bound_run_is_told_to_raise_workers(tmp_path):
    # The real run with its data wait scaled to 40% of training time (the captured run is not data-bound).
    lines = []
    for line in (DATA / "metrics-2epochs.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "epoch":
            record["data_wait_s"] = 0.4 * record["train_time_s"]
        lines.append(json.dumps(record))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(lines) + "\n")
    found = figures("steps", metrics)
    assert found["data wait"] == Figure(
        "data wait",
        "40% of training time waiting for the next batch",
        "over 25%: the loader is the bottleneck; raise --workers from 0 to 2 and ask for --cpus=3",
    )
    # Idle CPUs while the loader lags mean too few workers, not too many CPUs.
    assert found["CPU"].verdict == (
        "used 1.0 of 2 CPUs while training waited on data: raise --workers to 1 before asking for fewer"
    )


def test_a_run_cut_before_its_first_epoch_is_unknown_with_a_reason(tmp_path):
    # The requeued run's first attempt (start, a step, preempted), and a line cut off mid-write.
    first_attempt = (DATA / "metrics-requeued.jsonl").read_text().splitlines()[:3]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(first_attempt) + '\n{"event": "step", "ti')
    found = figures("running-gpu", metrics)
    assert found["throughput"] == Figure(
        "throughput",
        "0 of 2 epochs",
        "unknown: no epoch finished yet (the run is still going or stopped early)",
    )
    assert found["data wait"].verdict.startswith("unknown: no epoch finished yet")


# -- what is not known -------------------------------------------------------------------------------


def test_a_pending_job_is_unknown_everywhere_it_must_be():
    built = efficiency.build_report(sacct("pending"), None, None)
    assert built.state == "PENDING"
    found = {f.name: f for f in built.figures}
    for name in ("CPU", "memory", "time"):
        assert found[name] == Figure(name, "unknown", "unknown: the job has not started")


def test_a_running_job_reports_what_sacct_does_not_have_yet():
    found = figures("running-gpu")
    assert found["CPU"].verdict == "unknown: the job is still running (sacct adds CPU time when a step ends)"
    assert (
        found["memory"].verdict == "unknown: the job is still running (sacct records MaxRSS when a step ends)"
    )
    assert found["time"] == Figure(
        "time", "running for 00:00:12 of 00:10:00", "unknown: the job is still running"
    )


def test_a_job_shorter_than_one_accounting_sample_has_no_memory_figure():
    found = figures("short")
    assert found["memory"].verdict.startswith("unknown: no MaxRSS recorded (the job was shorter than one")
    assert found["CPU"].verdict == "unknown: the job ran for less than a second"


def test_missing_or_empty_metrics_are_unknown(tmp_path):
    missing = figures("steps", tmp_path / "metrics.jsonl")
    assert missing["throughput"].verdict.startswith("unknown: no metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("")
    empty = figures("steps", tmp_path / "metrics.jsonl")
    assert empty["data wait"].verdict == (
        "unknown: metrics.jsonl has no records (the trainer did not get to its first line)"
    )


def test_sacct_without_a_job_line_is_an_error_not_a_report():
    with pytest.raises(ValueError, match="no job line"):
        efficiency.build_report(sacct("steps")[1:], None, None)


# -- output ------------------------------------------------------------------------------------------


def test_format_report_prints_a_heading_and_a_line_per_figure():
    text = efficiency.format_report(efficiency.build_report(sacct("failed"), None, None))
    lines = text.splitlines()
    assert lines[0] == "job 3 (rpt-fail): FAILED, exit code 3:0"
    assert len(lines) == 1 + 6
    assert lines[1].split()[:2] == ["CPU", "49%"]  # 4.428 s of CPU in 9 s
    assert lines[3].startswith("  time ") and lines[3].endswith("no full run to size it from, keep 00:05:00")
    assert all(" -> " in line for line in lines[1:])


def test_plot_has_losses_per_epoch_and_step_and_gpu_utilisation(tmp_path):
    plot = efficiency.report_plot(DATA / "metrics-requeued.jsonl", DATA / "gpu-2gpus.csv")
    labels = [[line.get_label() for line in axes.get_lines()] for axes in plot.axes]
    assert labels == [
        ["train loss (step)", "train loss (epoch)", "val loss (epoch)"],
        ["GPU 0 utilisation", "GPU 1 utilisation"],
    ]
    step_losses = plot.axes[0].get_lines()[0]
    # Steps 10 and 20 of each epoch, of the 23 the start line reports (1438 samples in batches of 64).
    assert list(step_losses.get_xdata()) == pytest.approx([10 / 23, 20 / 23, 1 + 10 / 23, 1 + 20 / 23])
    assert plot.get_suptitle() == "job 7"
    png = efficiency.plot_report(
        DATA / "metrics-requeued.jsonl", DATA / "gpu-2gpus.csv", tmp_path / "report.png"
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_gpu_samples_or_metrics_is_still_a_png(tmp_path):
    plot = efficiency.report_plot(DATA / "metrics-2epochs.jsonl", None)
    assert len(plot.axes) == 1
    assert [line.get_label() for line in plot.axes[0].get_lines()] == [
        "train loss (step)", "train loss (epoch)", "val loss (epoch)",
    ]  # fmt: skip
    empty = efficiency.plot_report(None, None, tmp_path / "empty.png")
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_program_of_ones_own_that_writes_no_metrics_is_said_to_write_none_not_to_have_failed():
    """pytorch/examples' word-level language model trained and saved its model; the report said the trainer
    did not start. A program other than the example trainer writing no metrics.jsonl is its own choice."""
    built = efficiency.build_report(sacct("steps"), None, None, program="python main.py")
    found = {f.name: f for f in built.figures}
    assert found["throughput"].verdict == (
        "unknown: python main.py writes no metrics.jsonl "
        "(docs/own-project.md, 'Your program's metrics', adds one)"
    )
    assert "did not start" not in efficiency.format_report(built)


def test_only_a_job_that_runs_something_else_than_the_example_trainer_names_its_program():
    from hpcbox.jobs.fetch import _own_program
    from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand, Step, Steps

    assert _own_program(EXAMPLE_TRAINER) is None
    script = ContainerCommand("script", "main.py", ("--epochs", "3"))
    assert _own_program(script) == "python main.py"
    assert _own_program(ContainerCommand("entry_point", "lm.cli:main")) == "lm.cli:main"
    assert _own_program(Steps((Step("prep", script), Step("train", EXAMPLE_TRAINER)))) is None
    two = Steps((Step("prep", script), Step("fit", ContainerCommand("program", "fit"))))
    assert _own_program(two) == "python main.py then fit"


def test_the_metrics_the_docs_show_for_ones_own_program_give_throughput_and_data_wait(tmp_path):
    page = (Path(__file__).resolve().parents[2] / "docs" / "own-project.md").read_text()
    shown = re.search(r"per epoch\n`(\{\"event\": \"epoch\".*?\})`", page, re.DOTALL)
    assert shown is not None, "docs/own-project.md's example epoch line moved"
    epoch = json.loads(shown[1].replace("\n", " "))
    lines = [{**epoch, "epoch": n} for n in (1, 2)] + [{"event": "done"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = figures("steps", tmp_path / "metrics.jsonl")
    assert found["throughput"].value.startswith("2 of 10 epochs")
    assert not found["throughput"].verdict.startswith("unknown") and not found[
        "data wait"
    ].verdict.startswith("unknown")
