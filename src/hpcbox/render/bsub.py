"""The bsub job script for LSF sites (DTU): LSF's `#BSUB` header over the body Slurm scripts have.

`render_bsub` is a pure function (golden-tested), like `render_sbatch`, and renders the same body
through `sbatch.job_script` with LSF's `Dialect`. The header: the queue (`-q`), job slots (`-n`) on one
host (`span[hosts=1]`), the run limit (`-W [HH:]MM`), memory per slot (`rusage[mem=]` and `-M`: LSF
counts memory per slot where Slurm's `--mem` is per node), GPUs per host (`-gpu "num=N:..."`), the
warning signal before the run limit (`-wa USR1 -wt MINUTES`, Slurm's `--signal`), logs with LSF's `%J`
and `%I` (`-o` appends, as Slurm's `--open-mode=append` does) and a rerun after a host failure (`-r`).

Where the script differs from the Slurm one:
- Requeue after a checkpoint is `brequeue $LSB_JOBID` (the job keeps its id). LSF sets no count of
  requeues, so the script keeps one beside the run folder (`<run dir>.requeued`) for --max-restarts.
- A job stopped on request (bkill: INT, TERM, then KILL) ends by itself; nothing cancels it again.
- One node only, and DDP's processes start with torchrun there: LSF has no srun (resources refuses
  more). `--extra`, `--qos` and `--gpu-type` (the queue decides the model) have no LSF line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from hpcbox.errors import FieldError
from hpcbox.files import slug
from hpcbox.project.command import EXAMPLE_TRAINER, ContainerCommand
from hpcbox.render.options import RESOURCE_OPTIONS
from hpcbox.render.profiles import ClusterProfile
from hpcbox.render.resources import Resources
from hpcbox.render.sbatch import (
    CHECKPOINTED_EXIT,
    Dialect,
    JobInputs,
    JobScript,
    job_script,
    log_patterns,
    render_sbatch,
)
from hpcbox.units import SIZE_UNITS, parse_size


def dialect(array: bool) -> Dialect:
    """LSF's words for the shared body. An array's tasks share LSB_JOBID: LSB_JOBINDEX tells them apart
    (and is 0 outside arrays), and `brequeue ID` would requeue the whole array, `ID[INDEX]` one task."""
    job = "${LSB_JOBID}[${LSB_JOBINDEX}]" if array else "${LSB_JOBID}"
    return Dialect(
        scheduler="LSF",
        # bsub reads #BSUB lines from a script given on its standard input.
        submit="bsub < <this file>",
        submit_dir="LS_SUBCWD",
        job_id="LSB_JOBID",
        array_key="${LSB_JOBID}_${LSB_JOBINDEX}",
        scratch_key="$job_key",
        signals=(
            "# LSF signals the job: USR1 before the run limit (-wa/-wt), INT and TERM on bkill (then KILL).\n"
            "# The trainer checkpoints on USR1 and TERM."
        ),
        killed_by="the KILL that follows bkill",
        cancel_command="bkill",
        # LSF counts no requeues: the count is kept beside the run folder, which outlives each run.
        restarts='$(cat "$run_dir.requeued" 2>/dev/null || echo 0)',
        requeue=f'echo "$((restarts + 1))" >"$run_dir.requeued"\nbrequeue "{job}"',
        requeue_by_hand=f"brequeue {job}",
        cancel="",
        rendezvous=f"""\
# Several processes on this one node: hpctrain.torchrun starts them, passes USR1 and TERM on to them,
# and exits {CHECKPOINTED_EXIT} when they checkpointed. Static rendezvous, the store on this node.
rendezvous_host=127.0.0.1
rendezvous_port=$((20000 + (LSB_JOBID + LSB_JOBINDEX) % 20000))""",
        steps=False,
        # LSF suspends a preempted job by default: nothing to tell from its TERM.
        preemption=False,
    )


# What a #BSUB value may hold: how bsub would read quotes, backslashes or $ there is not assumed.
_BSUB_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@%=/+\[\]-]+$")
_BSUB_UNSAFE = re.compile(r"[\"\\$`]")
# Slurm's log patterns (as resources checked them) in LSF's: %J the job id, %I the array index.
_LOG_TOKEN = re.compile(r"%[jAax]")
# The user's setting behind each option that carries one, to name in errors.
_FIELDS = {"-J": "job_name", "-P": "account", "-u": "mail_user", "-o": "log", "-e": "error_log"}
# Resource strings, quoted as LSF's documentation and DTU's templates write them.
_QUOTED = ("-R", "-gpu")


def render_bsub(
    profile: ClusterProfile,
    resources: Resources,
    inputs: JobInputs,
    trainer_args: tuple[str, ...] = (),
    command: ContainerCommand = EXAMPLE_TRAINER,
) -> JobScript:
    """The bsub job script: `command` with its configured arguments, then `trainer_args`, in the container."""
    header = bsub_header(resources, inputs)
    lsf = dialect(array=resources.array is not None)
    return job_script(profile, resources, inputs, trainer_args, command, header=header, dialect=lsf)


_BSUB = {option.name: option.bsub for option in RESOURCE_OPTIONS if option.bsub}


def renderer(profile: ClusterProfile) -> Callable[..., JobScript]:
    """The profile's job script renderer: bsub for an LSF site, sbatch for a Slurm one."""
    return render_bsub if profile.lsf else render_sbatch


def bsub_header(resources: Resources, inputs: JobInputs) -> str:
    name = slug(resources.job_name)
    log, error_log = (
        _lsf_log(field, pattern, name) if pattern else None
        for field, pattern in zip(("log", "error_log"), log_patterns(resources, inputs.log_dir), strict=True)
    )
    # Each option's flag from the resource options' table; LSF counts slots and memory per slot.
    options: list[tuple[str, str | None]] = [
        (_BSUB["job_name"], _array_name(name, resources.array) if resources.array else name),
        (_BSUB["partition"], None if resources.partition.implicit else resources.partition.name),
        (_BSUB["cpus"], str(slots(resources))),
        ("-R", "span[hosts=1]"),
    ]
    if resources.mem:
        per_slot = memory_per_slot(resources)
        options += [("-R", f"rusage[mem={per_slot}]"), (_BSUB["mem"], per_slot)]
    options += [
        (_BSUB["time"], run_limit(resources.time_s) if resources.time_s is not None else None),
        (_BSUB["account"], resources.account),
        (_BSUB["mail_user"], resources.mail_user),
        *((flag, "") for flag in _mail_flags(resources.mail_type)),
        (_BSUB["log"], log),
        (_BSUB["error_log"], error_log),
    ]
    if resources.gpus:
        options.append((_BSUB["gpus"], f"num={resources.gpus}:mode=exclusive_process"))
    options += [
        ("-wa", "USR1"),
        ("-wt", str(math.ceil(resources.signal_margin_s / 60))),
        # Rerun after a host failure: the rerun carries on from the checkpoints copied back.
        ("-r", ""),
    ]
    lines = ["#!/bin/bash"]
    for flag, value in options:
        if value is None:
            continue
        if value == "":
            lines.append(f"#BSUB {flag}")
        elif flag in _QUOTED:
            lines.append(f'#BSUB {flag} "{value}"')
        else:
            lines.append(f"#BSUB {flag} {bsub_quote(_FIELDS.get(flag, flag), value)}")
    return "\n".join(lines)


def slots(resources: Resources) -> int:
    """Job slots: one per CPU, every process's CPUs on the one host."""
    return resources.tasks * (resources.cpus_per_task or 1)


def run_limit(seconds: int) -> str:
    """LSF's run limit, [HH:]MM: whole minutes, rounded up (a limit is never shortened)."""
    hours, minutes = divmod(math.ceil(seconds / 60), 60)
    return f"{hours}:{minutes:02d}"


def memory_per_slot(resources: Resources) -> str:
    """Slurm's memory per node (`resources.mem`, e.g. 32G) as LSF's memory per slot, rounded up."""
    assert resources.mem is not None
    total_mb = parse_size(resources.mem) / SIZE_UNITS["M"]
    per_slot = math.ceil(total_mb / slots(resources))
    return f"{per_slot // 1024}GB" if per_slot % 1024 == 0 else f"{per_slot}MB"


def bsub_quote(field_name: str, value: str) -> str:
    """``value`` on a #BSUB line: as is when plain, else in double quotes, which bsub groups."""
    if _BSUB_PLAIN.match(value):
        return value
    if _BSUB_UNSAFE.search(value) or not value.isprintable():
        raise FieldError(
            field_name, f"{value!r}: a #BSUB line cannot carry quotes, a backslash, $ or control characters"
        )
    return f'"{value}"'


def _array_name(name: str, spec: str) -> str:
    """Slurm's array spec (1-9:2,12%4) in LSF's job name: the indices in brackets, the limit after."""
    indices, _, limit = spec.partition("%")
    return f"{name}[{indices}]" + (f"%{limit}" if limit else "")


def _lsf_log(field_name: str, pattern: str, job_name: str) -> str:
    def one(match: re.Match[str]) -> str:
        return {"%j": "%J", "%A": "%J", "%a": "%I", "%x": job_name}[match.group()]

    translated = _LOG_TOKEN.sub(one, pattern)
    if "%" in translated.replace("%J", "").replace("%I", ""):
        raise FieldError(field_name, f"{pattern!r} holds a % that LSF would not read as hpcbox means it")
    return translated


def _mail_flags(kinds: str | None) -> list[str]:
    """LSF mails when the job starts (-B) and when it ends (-N), however it ended."""
    wanted = set((kinds or "NONE").split(","))
    flags = []
    if wanted & {"BEGIN", "ALL"}:
        flags.append("-B")
    if wanted & {"END", "FAIL", "ALL"}:
        flags.append("-N")
    return flags
