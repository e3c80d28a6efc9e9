"""The job efficiency report: what a job used against what it asked for, with advice for the next one.

Its inputs are what `hpcbox report` fetches after a job: sacct's parsable output (the job line and its
steps), the trainer's metrics.jsonl and the GPU samples nvidia-smi wrote during the job. Everything
here is pure (no SSH, no Slurm): each figure is one line with a verdict, and a figure whose input is
missing says "unknown" and why instead of guessing a number.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbox.render.resources import signal_margin
from hpcbox.units import SIZE_UNITS, format_request, format_size, format_time, parse_cpu_time, parse_size

if TYPE_CHECKING:
    from collections.abc import Mapping

    from matplotlib.figure import Figure as PlotFigure

SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobName", "Partition", "State", "ExitCode", "Restarts", "Elapsed", "ElapsedRaw",
    "Timelimit", "TimelimitRaw", "NNodes", "NCPUS", "NTasks", "TotalCPU", "CPUTimeRAW", "ReqMem",
    "MaxRSS", "AllocTRES", "ReqTRES", "NodeList", "Submit", "Start", "End",
)  # fmt: skip

# Memory and time requests are hard limits (the job is killed at them): ask for the peak plus this.
HEADROOM = 1.25
# A memory request is worth lowering when the peak plus headroom needs at most this share of it:
# one size step over what is needed is not.
OVERSIZED = 0.75
# Where a program of one's own learns to write metrics.jsonl.
_ADD_METRICS = "docs/own-project.md, 'Your program's metrics', adds one"
# The data-bound line (docs/trainer.md): above this share of training time spent waiting for batches,
# the loader, not the model, sets the pace.
DATA_BOUND = 0.25
# Mean GPU utilisation below this is worth a verdict of its own.
GPU_BUSY = 50.0

# ReqMem: Slurm before 21.08 appends c (per CPU) or n (per node); later versions print the job's
# memory TRES, the total over its nodes, with no suffix.
_REQ_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)([cn]?)$")
_GPU_TIMESTAMP = "%Y/%m/%d %H:%M:%S.%f"


@dataclass(frozen=True)
class Figure:
    """One line of the report: what was measured and what to do about it."""

    name: str
    value: str
    verdict: str


@dataclass(frozen=True)
class Report:
    job_id: str
    state: str
    figures: tuple[Figure, ...]
    job_name: str = ""
    exit_code: str = ""
    cause: str = ""  # why it ended, where Slurm's state does not say it (a kill for memory)


@dataclass(frozen=True)
class MemoryRequest:
    """ReqMem as sacct prints it, resolved to bytes per node (the unit Slurm enforces)."""

    per_node: int
    form: str  # "node", "cpu" or "job" (the no-suffix total of Slurm 21.08+)


@dataclass(frozen=True)
class Training:
    """What the trainer's metrics.jsonl says about the run (every attempt of a requeued job)."""

    epochs_planned: int | None
    epochs_done: int
    finished: bool
    mean_epoch_s: float | None
    samples_per_s: float | None
    data_wait: float | None
    workers: int | None
    resumed: int
    preempted: int
    # Seconds from each stop's checkpoint to the next run's start: time the job spent not training.
    stopped_s: float = 0.0


@dataclass(frozen=True)
class GpuStats:
    index: str
    mean_utilisation: float
    peak_memory: int
    total_memory: int


# -- parsing -----------------------------------------------------------------------------------------


def parse_req_mem(text: str, ncpus: int, nnodes: int) -> MemoryRequest:
    """ReqMem in any of its forms: 500Mc (per CPU), 1Gn (per node), 1G (job total, Slurm 21.08+)."""
    match = _REQ_MEM.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm memory request")
    number, unit, suffix = match.groups()
    amount = parse_size(number + unit, default_unit="M")
    if suffix == "c":
        return MemoryRequest(amount * ncpus // max(nnodes, 1), "cpu")
    if suffix == "n":
        return MemoryRequest(amount, "node")
    return MemoryRequest(amount // max(nnodes, 1), "job")


def _times(count: int) -> str:
    return f"{count} time" + ("s" if count != 1 else "")


def gpus_asked(tres: str) -> int:
    """N from gres/gpu=N in a TRES string (typed entries such as gres/gpu:a100=N repeat the count)."""
    for item in tres.split(","):
        key, _, count = item.partition("=")
        if key == "gres/gpu":
            return int(count)
    return 0


# -- sensible request sizes --------------------------------------------------------------------------


def suggest_mem(peak: float) -> int:
    """The peak plus headroom, rounded up to a size people ask for: 128M steps, whole G, then 4G steps."""
    need = peak * HEADROOM
    if need < SIZE_UNITS["G"]:
        step = 128 * SIZE_UNITS["M"]
    elif need < 16 * SIZE_UNITS["G"]:
        step = SIZE_UNITS["G"]
    else:
        step = 4 * SIZE_UNITS["G"]
    return math.ceil(need / step) * step


def _round_time(seconds: float) -> int:
    """Up to a limit people ask for: whole minutes to 10 min, 5 min to 1 h, 15 min to 6 h, then hours."""
    minutes = math.ceil(seconds / 60)
    step = 1 if minutes <= 10 else 5 if minutes <= 60 else 15 if minutes <= 360 else 60
    return math.ceil(minutes / step) * step * 60


def suggest_time(elapsed_s: float) -> int:
    """A limit that leaves headroom after the run *and* after hpcbox's checkpoint signal: the job
    script signals the trainer `signal_margin` before the limit, and a run still going then is
    checkpointed and requeued rather than finished."""
    need = elapsed_s * HEADROOM
    limit = _round_time(need)
    while limit - signal_margin(limit) < need:
        limit = _round_time(limit + 1)
    return limit


# -- figures -----------------------------------------------------------------------------------------


def _unknown(name: str, why: str) -> Figure:
    return Figure(name, "unknown", f"unknown: {why}")


def _not_started(job: dict[str, str]) -> bool:
    return job["State"] == "PENDING" or job["Start"] in ("", "Unknown", "None")


def cpu_figure(job: dict[str, str], training: Training | None) -> Figure:
    """CPU efficiency as seff computes it: TotalCPU / (Elapsed x NCPUS)."""
    if _not_started(job):
        return _unknown("CPU", "the job has not started")
    if job["State"] == "RUNNING":
        return _unknown("CPU", "the job is still running (sacct adds CPU time when a step ends)")
    elapsed, ncpus, nodes = int(job["ElapsedRaw"]), int(job["NCPUS"]), int(job["NNodes"] or 1)
    if elapsed == 0:
        return _unknown("CPU", "the job ran for less than a second")
    cpu_s = parse_cpu_time(job["TotalCPU"])
    busy = cpu_s / elapsed
    resolution = ""
    if ncpus < busy and cpu_s <= ncpus * (elapsed + 1):
        # Start and End are whole seconds: a run of 6.6 s can read 6 s. Within that, all its CPUs.
        busy, resolution = ncpus, f" ({cpu_s:.1f} s of CPU in what sacct counts as {elapsed} s)"
    used = round(busy, 1)  # advice follows the figure the user reads
    value = f"{busy / ncpus:.0%} efficiency: {used:.1f} of {ncpus} CPUs busy on average{resolution}"
    # A CPU shortfall slows a job down but never kills it: no headroom beyond the next whole CPU.
    wanted = max(1, math.ceil(used / nodes))
    per_node = " per node" if nodes > 1 else ""
    if used > ncpus:
        return Figure(
            "CPU",
            value,
            f"used {used:.1f} of {ncpus} CPUs, more than it was given (nothing bound it to them here; "
            f"a site that binds tasks slows it down): ask for {wanted}{per_node}",
        )
    if wanted * nodes >= ncpus:
        return Figure("CPU", value, f"used {used:.1f} of {ncpus} CPUs: the request fits")
    if training is not None and training.data_wait is not None and training.data_wait > DATA_BOUND:
        return Figure(
            "CPU",
            value,
            f"used {used:.1f} of {ncpus} CPUs while training waited on data: "
            f"raise --workers to {ncpus // nodes - 1} before asking for fewer",
        )
    return Figure("CPU", value, f"used {used:.1f} of {ncpus} CPUs: ask for {wanted}{per_node}")


def _stopped_early(job: dict[str, str]) -> bool:
    """Failed, cancelled, killed: the run did not go to its end, so what it used is a lower bound."""
    return job["State"] not in ("COMPLETED", "RUNNING", "TIMEOUT") and not job["State"].startswith(
        "OUT_OF_MEMORY"
    )


@dataclass(frozen=True)
class MemoryKill:
    """A job stopped for passing its --mem, with what it asked per node and its peak (0: unknown)."""

    asked: int
    peak: int
    by_accounting: bool  # Slurm's sampled-RSS kill (FAILED or CANCELLED), not a cgroup's OUT_OF_MEMORY

    @property
    def suggestion(self) -> str:
        # Killed at the limit: the peak it would have reached is unknown, so add headroom to the larger
        # of the limit (plus headroom) and the peak it was killed at.
        return f"--mem={format_request(suggest_mem(max(self.asked * HEADROOM, self.peak)))}"

    def in_words(self) -> str:
        """The cause, for `status` and the report's heading."""
        asked = format_request(self.asked)
        if self.by_accounting:
            return (
                f"out of memory (OUT_OF_MEMORY where cgroups enforce it): its peak of "
                f"{format_size(self.peak)} passed --mem={asked} and Slurm killed it; "
                f"ask for at least {self.suggestion}"
            )
        return f"out of memory at --mem={asked}: ask for at least {self.suggestion}"


def memory_kill(sacct_rows: list[dict[str, str]]) -> MemoryKill | None:
    """Whether the job (sacct's job line and its steps, with State, NCPUS, NNodes, ReqMem and MaxRSS)
    was stopped for its memory: OUT_OF_MEMORY from a cgroup (a cgroup site's ending, and the mini
    cluster's), or, where Slurm enforces --mem by its own accounting (JobAcctGatherParams=
    OverMemoryKill: sites without cgroups, and the mini cluster on an engine that gives its nodes none),
    a job that did not complete with a step whose sampled peak passed its request: such a kill ends
    FAILED (0:9) or CANCELLED."""
    jobs = [row for row in sacct_rows if "." not in row["JobID"]]
    if not jobs or _not_started(jobs[0]):
        return None
    job = jobs[0]
    steps = [row for row in sacct_rows if row["JobID"].startswith(job["JobID"] + ".")]
    asked = parse_req_mem(job["ReqMem"], int(job["NCPUS"]), int(job["NNodes"] or 1)).per_node
    peak = max((parse_size(step["MaxRSS"]) for step in steps if step["MaxRSS"]), default=0)
    if any(row["State"].startswith("OUT_OF_MEMORY") for row in (job, *steps)):
        return MemoryKill(asked, peak, by_accounting=False)
    if asked and peak > asked and _stopped_early(job):
        return MemoryKill(asked, peak, by_accounting=True)
    return None


def memory_figure(job: dict[str, str], steps: list[dict[str, str]]) -> Figure:
    """Peak MaxRSS over the steps against the memory asked for per node."""
    if _not_started(job):
        return _unknown("memory", "the job has not started")
    peaks = [parse_size(step["MaxRSS"]) for step in steps if step["MaxRSS"]]
    killed = memory_kill([job, *steps])
    if not peaks and killed is None:
        if job["State"] == "RUNNING":
            return _unknown("memory", "the job is still running (sacct records MaxRSS when a step ends)")
        return _unknown(
            "memory",
            "no MaxRSS recorded (the job was shorter than one accounting sample, or the cluster "
            "does not gather memory use)",
        )
    peak = max(peaks, default=0)
    nodes = int(job["NNodes"] or 1)
    request = parse_req_mem(job["ReqMem"], int(job["NCPUS"]), nodes)
    suggestion = f"--mem={format_request(suggest_mem(peak))}" + (" per node" if nodes > 1 else "")
    if request.per_node == 0:
        if not peaks:
            return _unknown(
                "memory", "no MaxRSS recorded, and it asked for all of the node's memory (--mem=0)"
            )
        value = f"peak {format_size(peak)}, asked for all of the node's memory (--mem=0)"
        return Figure("memory", value, f"ask for {suggestion}")
    asked = format_request(request.per_node) + (" per node" if nodes > 1 else "")
    form = f" ({job['ReqMem'].removesuffix('c')} per CPU)" if request.form == "cpu" else ""
    value = f"peak {format_size(peak)} of {asked} asked{form} ({peak / request.per_node:.0%})"
    if killed is not None and peak < request.per_node:
        # A cgroup kills a process at the limit itself, between the accounting's samples (every few
        # seconds at most sites, every second on the mini cluster): what was sampled is below it.
        sampled = f"last sampled {format_size(peak)}" if peaks else "no sample recorded"
        value = f"reached the {asked} asked{form} ({sampled}: killed between samples)"
    if killed is not None:
        per_node = " per node" if nodes > 1 else ""
        return Figure(
            "memory", value, f"ran out of memory at {asked}: ask for at least {killed.suggestion}{per_node}"
        )
    peaked = f"asked {asked}, peaked at {format_size(peak)}"
    if _stopped_early(job):
        return Figure(
            "memory", value, f"{peaked} before it stopped ({job['State']}): ask for at least {suggestion}"
        )
    if suggest_mem(peak) > request.per_node:
        return Figure("memory", value, f"{peaked}, too close to the limit: ask for {suggestion}")
    if suggest_mem(peak) <= request.per_node * OVERSIZED:
        return Figure("memory", value, f"{peaked}: ask for {suggestion} next time")
    return Figure("memory", value, f"{peaked}: the request fits")


def time_figure(job: dict[str, str], training: Training | None = None) -> Figure:
    """Elapsed against the time limit, with a limit that fits the run and hpcbox's checkpoint signal;
    for a run stopped early, one that fits its planned epochs at the time its epochs took."""
    if _not_started(job):
        return _unknown("time", "the job has not started")
    elapsed = int(job["ElapsedRaw"])
    limit = int(job["TimelimitRaw"]) * 60 if job["TimelimitRaw"].isdigit() else None
    ran = format_time(elapsed)
    if job["State"] == "RUNNING":
        of = f" of {format_time(limit)}" if limit else ""
        return Figure("time", f"running for {ran}{of}", "unknown: the job is still running")
    suggestion = f"--time={format_time(suggest_time(elapsed))}"
    asked = format_time(limit) if limit is not None else None
    value = f"{ran} of {asked} ({elapsed / limit:.0%})" if limit is not None else f"{ran}, no time limit"
    if _stopped_early(job):
        # What it ran says nothing of what a whole run needs: its epochs' time does, where it is known.
        stopped = f"stopped ({job['State']}) after {ran}"
        whole = _planned_s(training)
        if whole is None:
            keep = f", keep {asked}" if asked else ""
            return Figure("time", value, f"{stopped}: no full run to size it from{keep}")
        assert training is not None and training.mean_epoch_s is not None
        return Figure(
            "time",
            value,
            f"{stopped}; its {training.epochs_planned} epochs at {training.mean_epoch_s:.1f} s each take "
            f"about {format_time(round(whole))}: a whole run needs --time={format_time(suggest_time(whole))}",
        )
    if limit is None:
        return Figure("time", value, f"ask for {suggestion}: jobs with a short limit start sooner")
    if job["State"] == "TIMEOUT":
        return Figure(
            "time",
            value,
            f"killed at the {asked} limit before finishing: ask for at least "
            f"--time={format_time(suggest_time(limit))}, or checkpoint and requeue",
        )
    restarts = int(job["Restarts"] or 0)
    if restarts:
        # sacct -j shows the last run only: earlier runs may each have used the whole limit.
        return Figure(
            "time", value, f"requeued {_times(restarts)}, sacct shows the last run only: keep --time={asked}"
        )
    if suggest_time(elapsed) >= limit:
        return Figure("time", value, f"ran {ran}: the {asked} limit fits")
    return Figure("time", value, f"ran {ran} of {asked}: ask for {suggestion}")


def stops_figure(training: Training | None, preempted_runs: int) -> Figure | None:
    """How often the job stopped and resumed, why (preempted by Slurm, where accounting has PREEMPTED
    runs, else its time limit), and the time it lost not training in between; None for a job that ran
    through."""
    stops = training.preempted if training else 0
    if not stops and not preempted_runs:
        return None
    by = (
        f"preempted by Slurm ({preempted_runs} earlier run{'s' if preempted_runs != 1 else ''} PREEMPTED "
        "in accounting)"
        if preempted_runs
        else "at its time limit"
    )
    if training is None:
        return Figure("stops", f"requeued, {by}", "unknown: no metrics.jsonl to say how long it was stopped")
    if not training.stopped_s:
        return Figure("stops", f"stopped {_times(stops)}, {by}", "not resumed yet")
    lost = format_time(round(training.stopped_s))
    return Figure(
        "stops",
        f"stopped {_times(stops)}, {by}",
        f"{lost} lost between checkpoint and resume (copying back, waiting to run again, starting again)",
    )


def gpu_figure(job: dict[str, str], gpu_csv: Path | None) -> Figure:
    """Mean utilisation and peak memory per GPU from nvidia-smi's samples."""
    asked = gpus_asked(job["AllocTRES"] or job["ReqTRES"])
    if gpu_csv is None or not gpu_csv.is_file():
        if asked:
            return Figure("GPUs", f"{asked} asked", "unknown: no GPU samples (nvidia-smi not on the node)")
        return Figure("GPUs", "none asked", "a CPU-only job: nothing to check")
    stats = gpu_stats(read_gpu_samples(gpu_csv))
    if not stats:
        first_line = _first_line(gpu_csv)
        said = f" ({first_line})" if first_line else ""
        return Figure("GPUs", f"{asked} asked", f"unknown: no GPU samples in {gpu_csv.name}{said}")
    value = "; ".join(
        f"GPU {gpu.index}: {gpu.mean_utilisation:.0f}% busy, "
        f"peak {format_size(gpu.peak_memory)} of {format_size(gpu.total_memory)}"
        for gpu in stats
    )
    busy = [gpu for gpu in stats if gpu.mean_utilisation >= 1]
    if asked and len(busy) < asked:
        return Figure(
            "GPUs", value, f"asked for {asked} GPUs, {len(busy)} did any work: ask for {max(len(busy), 1)}"
        )
    mean = sum(gpu.mean_utilisation for gpu in stats) / len(stats)
    if mean < GPU_BUSY:
        return Figure(
            "GPUs",
            value,
            f"busy {mean:.0f}% on average: the GPUs wait for input; raise --workers or --batch-size "
            "before asking for more GPUs",
        )
    return Figure("GPUs", value, f"busy {mean:.0f}% on average: well used")


def _planned_s(training: Training | None) -> float | None:
    """How long all the planned epochs take at the time each took, where both are known."""
    if training is None or training.epochs_planned is None or training.mean_epoch_s is None:
        return None
    return training.epochs_planned * training.mean_epoch_s


def resume_advice(training: Training, resume: str | None) -> str:
    """What to do about a run stopped before its last epoch: ``resume`` (the command that starts a job
    from its last checkpoint) with a time limit for the epochs left, where both are known."""
    if resume is None:  # a sweep's task: its point reruns whole
        return "`submit --resubmit-failed` runs the points that stopped again"
    left = None
    if training.epochs_planned is not None and training.mean_epoch_s is not None:
        left = (training.epochs_planned - training.epochs_done) * training.mean_epoch_s
    limit = "" if left is None else f" --time={format_time(suggest_time(left))}"
    return f"resume from its last checkpoint: `{resume}{limit}`"


def throughput_figures(
    training: Training | None, why_missing: str, resume: str | None = None
) -> tuple[Figure, Figure]:
    """Epoch time and samples/s, and the share of training time spent waiting for data; ``resume``: the
    command that resumes the job, for a run stopped early."""
    if training is None:
        return _unknown("throughput", why_missing), _unknown("data wait", why_missing)
    restarts = f", resumed {_times(training.resumed)}" if training.resumed else ""
    planned = training.epochs_planned or "?"
    progress = f"{training.epochs_done} of {planned} epochs{restarts}"
    if training.mean_epoch_s is None or training.samples_per_s is None or training.data_wait is None:
        why = "no epoch finished yet" + (
            " (the run is still going or stopped early)" if not training.finished else ""
        )
        return Figure("throughput", progress, f"unknown: {why}"), _unknown("data wait", why)
    value = f"{progress}, {training.mean_epoch_s:.1f} s per epoch, {training.samples_per_s:.0f} samples/s"
    if training.finished:
        verdict = f"finished all {planned} epochs" + (
            f" after being stopped {_times(training.preempted)} and resumed from checkpoints"
            if training.preempted
            else ""
        )
    else:
        verdict = (
            f"stopped after {training.epochs_done} of {planned} epochs: {resume_advice(training, resume)}"
        )
    wait = f"{training.data_wait:.0%} of training time waiting for the next batch"
    if training.data_wait > DATA_BOUND:
        workers = training.workers or 0
        more = max(2, 2 * workers)
        wait_verdict = (
            f"over {DATA_BOUND:.0%}: the loader is the bottleneck; raise --workers from {workers} to {more} "
            f"and ask for --cpus={more + 1}"
        )
    else:
        wait_verdict = f"under {DATA_BOUND:.0%}: the loader keeps up"
    return Figure("throughput", value, verdict), Figure("data wait", wait, wait_verdict)


# -- inputs ------------------------------------------------------------------------------------------


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of metrics.jsonl; a line that does not parse is skipped, since a job killed
    mid-write leaves a partial last line."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            records.append(record)
    return records


def _latest_by(records: list[dict[str, Any]], event: str, *keys: str) -> list[dict[str, Any]]:
    """One record per key, the last written: a run resumed from an older checkpoint repeats lines."""
    latest = {tuple(r[k] for k in keys): r for r in records if r["event"] == event}
    return [latest[key] for key in sorted(latest)]


def summarise_training(records: list[dict[str, Any]]) -> Training:
    starts = [r for r in records if r["event"] == "start"]
    epochs = _latest_by(records, "epoch", "epoch")
    # An epoch resumed mid-way reports the time since the resume only: not a whole epoch's time.
    whole = [e for e in epochs if not e.get("resumed_at_step")] or epochs
    train_time = sum(e["train_time_s"] for e in epochs)
    planned = epochs[-1]["epochs"] if epochs else starts[-1]["config"]["epochs"] if starts else None
    return Training(
        epochs_planned=planned,
        epochs_done=len(epochs),
        finished=any(r["event"] == "done" for r in records),
        mean_epoch_s=sum(e["epoch_time_s"] for e in whole) / len(whole) if whole else None,
        # Weighted by training time: a resumed epoch's rate covers only its few steps after the resume.
        samples_per_s=sum(e["samples_per_s"] * e["train_time_s"] for e in epochs) / train_time
        if train_time
        else None,
        data_wait=sum(e["data_wait_s"] for e in epochs) / train_time if train_time else None,
        workers=starts[-1]["workers"] if starts else None,
        resumed=sum(1 for s in starts if s.get("resumed")),
        preempted=sum(1 for r in records if r["event"] == "preempted"),
        stopped_s=_stopped_s(records),
    )


def _stopped_s(records: list[dict[str, Any]]) -> float:
    """Seconds between each stop (the trainer's `preempted` line, written with its checkpoint) and the
    start of the run after it; a stop no run followed counts nothing."""
    stopped, at = 0.0, None
    for record in records:
        if record["event"] == "preempted":
            at = record["time"]
        elif record["event"] == "start" and at is not None:
            stopped += max(0.0, record["time"] - at)
            at = None
    return stopped


def read_gpu_samples(path: Path) -> list[dict[str, str]]:
    """nvidia-smi's CSV rows keyed by query field (timestamp, index, utilization.gpu, ...), with or
    without units. Header lines recur (a requeued job appends) and anything else nvidia-smi printed
    into the file (the job script sends its errors there too) is skipped."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for cells in csv.reader(path.read_text().splitlines(), skipinitialspace=True):
        if cells and cells[0] == "timestamp":
            header = [cell.split(" [")[0] for cell in cells]
        elif header is not None and len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _number(cell: str) -> float | None:
    """'87 %', '87', '10240 MiB' as numbers; '[N/A]' and the like as None."""
    try:
        return float(cell.split()[0])
    except (ValueError, IndexError):
        return None


def gpu_stats(rows: list[dict[str, str]]) -> list[GpuStats]:
    by_gpu: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_gpu.setdefault(row["index"], []).append(row)
    stats = []
    for index, samples in sorted(by_gpu.items()):
        busy = [u for u in (_number(s["utilization.gpu"]) for s in samples) if u is not None]
        used = [m for m in (_number(s["memory.used"]) for s in samples) if m is not None]
        total = [m for m in (_number(s["memory.total"]) for s in samples) if m is not None]
        if busy and used and total:
            mib = SIZE_UNITS["M"]
            stats.append(
                GpuStats(index, sum(busy) / len(busy), round(max(used) * mib), round(max(total) * mib))
            )
    return stats


def _first_line(path: Path) -> str:
    lines = path.read_text().strip().splitlines()
    return lines[0].strip() if lines else ""


# -- the report --------------------------------------------------------------------------------------


def build_report(
    sacct_rows: list[dict[str, str]],
    metrics_jsonl: Path | None,
    gpu_csv: Path | None,
    program: str | None = None,
    *,
    why_no_metrics: str | None = None,
    resume: str | None = None,
    preempted_runs: int = 0,
) -> Report:
    """The report of one job from its sacct rows (job line first, as sacct prints it) and whichever
    of its metrics and GPU samples were fetched. ``program``: what the job ran, where that is not the
    example trainer (which always writes metrics.jsonl): its missing metrics are then its own choice.
    ``why_no_metrics``: why there are none, where the caller knows (the job copied nothing back).
    ``resume``: the command that starts a job from this one's last checkpoint (said where it stopped
    before its last epoch). ``preempted_runs``: how many of its earlier runs accounting ends PREEMPTED
    (`tools.slurm.all_runs`)."""
    jobs = [row for row in sacct_rows if "." not in row["JobID"]]
    if not jobs:
        raise ValueError("sacct printed no job line (is the job id right, and is accounting enabled?)")
    job = jobs[0]
    steps = [row for row in sacct_rows if row["JobID"].startswith(job["JobID"] + ".")]
    training = None
    why_missing = "no metrics.jsonl (the trainer did not start, or the results were not fetched)"
    if program is not None:
        why_missing = f"{program} writes no metrics.jsonl ({_ADD_METRICS})"
    if why_no_metrics is not None:
        why_missing = why_no_metrics
    if metrics_jsonl is not None and metrics_jsonl.is_file():
        records = read_metrics(metrics_jsonl)
        if records:
            training = summarise_training(records)
        else:
            why_missing = f"{metrics_jsonl.name} has no records (the trainer did not get to its first line)"
    figures = (
        cpu_figure(job, training),
        memory_figure(job, steps),
        time_figure(job, training),
        gpu_figure(job, gpu_csv),
        *throughput_figures(training, why_missing, resume),
    )
    stops = stops_figure(training, preempted_runs)
    figures += (stops,) if stops else ()
    killed = memory_kill([job, *steps])
    return Report(
        job["JobID"], job["State"], figures, job_name=job["JobName"], exit_code=job["ExitCode"],
        cause=killed.in_words() if killed else "",
    )  # fmt: skip


def format_report(report: Report) -> str:
    """The report for the terminal: a heading, then a line per figure with its verdict."""
    name = f" ({report.job_name})" if report.job_name else ""
    exit_code = f", exit code {report.exit_code}" if report.exit_code else ""
    cause = f": {report.cause}" if report.cause else ""
    lines = [f"job {report.job_id}{name}: {report.state}{exit_code}{cause}"]
    name_width = max(len(figure.name) for figure in report.figures)
    value_width = max(len(figure.value) for figure in report.figures)
    lines += [
        f"  {figure.name:<{name_width}}  {figure.value:<{value_width}}  -> {figure.verdict}"
        for figure in report.figures
    ]
    return "\n".join(lines) + "\n"


def sweep_report(
    job_id: str, points: Mapping[int, tuple[str, ...]], sacct_rows: list[dict[str, str]], results: Path
) -> str:
    """A sweep's report: a line per point it ran (``points``, by task id: a rerun's are some of its
    sweep's) with its state, time, memory peak and, where its fetched metrics.jsonl has them, its last
    epoch's validation figures, then a line of them all; each point's full report is `report -j
    JOB_TASK`."""
    lines, counts, best = [], {}, None
    for index, point in points.items():
        task = f"{job_id}_{index}"
        rows = [row for row in sacct_rows if row["JobID"] == task or row["JobID"].startswith(task + ".")]
        own = next((row for row in rows if row["JobID"] == task), None)
        state = own["State"] if own else "unknown to sacct"
        counts[state] = counts.get(state, 0) + 1
        parts = [state]
        if own and own["Elapsed"]:
            parts.append(f"ran {own['Elapsed']}")
        peaks = [parse_size(row["MaxRSS"]) for row in rows if row["MaxRSS"]]
        if peaks:
            parts.append(f"peak {format_size(max(peaks))}")
        metrics = results / str(index) / "metrics.jsonl"
        epochs = [r for r in read_metrics(metrics) if r["event"] == "epoch"] if metrics.is_file() else []
        if epochs and "val_accuracy" in epochs[-1]:
            last = epochs[-1]
            figures = f"val accuracy {last['val_accuracy']:.3f}, val loss {last['val_loss']:.3f}"
            parts.append(f"epoch {last['epoch']}: {figures}")
            if best is None or last["val_accuracy"] > best[0]:
                best = (last["val_accuracy"], index, point)
        lines.append(f"  task {index} ({shlex.join(point) or 'no options'}): {', '.join(parts)}")
    summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    head = f"sweep {job_id}: {len(points)} points: {summary}"
    if best is not None:
        head += f"; best val accuracy {best[0]:.3f}, task {best[1]} ({shlex.join(best[2])})"
    return "\n".join([head, *lines, f"  (each point's own report: `hpcbox report -j {job_id}_TASK`)"]) + "\n"


# -- the plot ----------------------------------------------------------------------------------------


def report_plot(metrics_jsonl: Path | None, gpu_csv: Path | None) -> PlotFigure:
    """The figure `plot_report` saves: losses per epoch (and per step when logged) and, with GPU
    samples, utilisation over time. Every series carries a label, so callers can check what is drawn."""
    # Imported here: matplotlib takes a second to import, and the text report does not need it.
    from matplotlib.figure import Figure as PlotFigure

    records = read_metrics(metrics_jsonl) if metrics_jsonl is not None and metrics_jsonl.is_file() else []
    samples = read_gpu_samples(gpu_csv) if gpu_csv is not None and gpu_csv.is_file() else []
    plot = PlotFigure(figsize=(8, 7 if samples else 4), layout="constrained")
    loss_axes = plot.add_subplot(2 if samples else 1, 1, 1)
    _plot_losses(loss_axes, records)
    if samples:
        _plot_gpus(plot.add_subplot(2, 1, 2), samples)
    job_ids = [r.get("slurm_job_id") for r in records if r["event"] == "start" and r.get("slurm_job_id")]
    plot.suptitle(f"job {job_ids[-1]}" if job_ids else "training run")
    return plot


def _plot_losses(axes: Any, records: list[dict[str, Any]]) -> None:
    epochs = _latest_by(records, "epoch", "epoch")
    starts = [r for r in records if r["event"] == "start"]
    steps = _latest_by(records, "step", "epoch", "step")
    if steps and starts:
        per_epoch = starts[-1]["steps_per_epoch"]
        axes.plot(
            [s["epoch"] - 1 + s["step"] / per_epoch for s in steps],
            [s["loss"] for s in steps],
            color="0.6",
            linewidth=1,
            label="train loss (step)",
        )
    if epochs:
        numbers = [e["epoch"] for e in epochs]
        axes.plot(numbers, [e["train_loss"] for e in epochs], marker="o", label="train loss (epoch)")
        axes.plot(numbers, [e["val_loss"] for e in epochs], marker="s", label="val loss (epoch)")
    if not (epochs or steps):
        axes.text(0.5, 0.5, "no losses logged", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlabel("epoch")
    axes.set_ylabel("loss")
    if epochs or steps:
        axes.legend()


def _plot_gpus(axes: Any, samples: list[dict[str, str]]) -> None:
    times = [datetime.strptime(s["timestamp"], _GPU_TIMESTAMP) for s in samples]
    first = min(times)
    by_gpu: dict[str, tuple[list[float], list[float]]] = {}
    for sample, when in zip(samples, times, strict=True):
        busy = _number(sample["utilization.gpu"])
        if busy is not None:
            minutes, values = by_gpu.setdefault(sample["index"], ([], []))
            minutes.append((when - first).total_seconds() / 60)
            values.append(busy)
    for index, (minutes, values) in sorted(by_gpu.items()):
        axes.plot(minutes, values, label=f"GPU {index} utilisation")
    axes.set_xlabel("minutes since the first sample")
    axes.set_ylabel("utilisation (%)")
    axes.set_ylim(0, 105)
    axes.legend()


def plot_report(metrics_jsonl: Path | None, gpu_csv: Path | None, png: Path) -> Path:
    """`report_plot` saved as a PNG (matplotlib's Agg renderer: no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    plot = report_plot(metrics_jsonl, gpu_csv)
    FigureCanvasAgg(plot).print_png(png)
    return png
