"""The sbatch job script, rendered from a cluster profile, checked resources and the job's inputs.

`render_sbatch` is a pure function (golden-tested). Everything a user or another stage supplies is
quoted: with `shlex` in the shell body, and in sbatch's own quoting (double quotes, backslash escapes)
on `#SBATCH` lines, which sbatch parses itself before bash ever sees the file.

The body (staging, the container, signals, copy-back, requeue) is shared with other schedulers'
headers through `job_script` and a `Dialect`: the variables it reads and the commands it runs
(`hpcbox.render.bsub` renders LSF's).
"""

from __future__ import annotations

import functools
import re
import shlex
import string
import textwrap
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError
from hpcbox.files import slug, write_atomically
from hpcbox.project.command import (
    CODE_MOUNT,
    EXAMPLE_TRAINER,
    NOTEBOOK,
    NOTEBOOK_CONFIG_DIR,
    NOTEBOOK_RUNTIME_DIR,
    OUTPUT_DIR,
    SCRATCH_MOUNT,
    ContainerCommand,
    Steps,
)
from hpcbox.render import logpaths
from hpcbox.render.options import RESOURCE_OPTIONS
from hpcbox.render.profiles import ClusterProfile, assumptions
from hpcbox.render.resources import SBATCH_ENVIRONMENT, Resources, ddp_processes
from hpcbox.render.sweep import Sweep
from hpcbox.units import format_time

# The trainer's exit status for "checkpointed on a signal, run me again" (EX_TEMPFAIL).
CHECKPOINTED_EXIT = 75
# In a job's run folder (an array task's own): the program's exit status, written as the script ends it.
OUTCOME_FILE = ".hpcbox-exit"
# The line the job script writes to its log once its traps are set (a regular expression for grep -E):
# before it, TERM to its batch shell alone ends the script unsaved, and Slurm calls the job FAILED.
SCRIPT_STARTED = r"^hpcbox: job [0-9]+ on .*: node scratch "
# In a job's run folder: the name of the submission it is the folder of (JobInputs.submission).
SUBMISSION_FILE = ".hpcbox-submission"
GPU_SAMPLE_INTERVAL_S = 30
# While the job runs, the small files that changed (each under LIVE_FILE_KIB: logs, metrics, curves)
# reach the run folder between the whole copies (sync_every), for `hpcbox watch`: four times as often,
# and every LIVE_COPY_S at least, the watch's own interval (FOLLOW_EVERY_S): a step then shows here
# within two looks (at 30 s, the median line took 1.5 to 2.2 looks: bench/results/watch.json's history
# in the CHANGELOG).
LIVE_COPY_S = 10
LIVE_FILE_KIB = 16384
# What a process started by srun learns of its place in the job (MPI and most launchers read these).
SLURM_TASK_IDENTITY = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS")

_SBATCH_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@%=/+-]+$")
# The script's static bash, beside this file.
_TEMPLATE = Path(__file__).resolve().with_name("job.sh.in")
# One task on each of the job's nodes, beside whatever else runs there.
_SRUN_EACH_NODE = (
    'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
    "--ntasks-per-node=1 --overlap --mem=0"
)


class _Bash(string.Template):
    """A section of job.sh.in: `@{name}` is filled in, and nothing else: `$@`, `${a[@]}` are bash's."""

    pattern = r"@(?:\{(?P<braced>[a-z_]+)\}|(?P<escaped>(?!))|(?P<named>(?!))|(?P<invalid>(?!)))"


@functools.cache
def _sections() -> dict[str, _Bash]:
    """job.sh.in's sections by name: from a `#@section NAME` line to the next `#@` line, less its newline."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in _TEMPLATE.read_text().splitlines(keepends=True):
        if line.startswith("#@"):
            name = line.removeprefix("#@section ").strip() if line.startswith("#@section ") else None
            current = sections.setdefault(name, []) if name else None
        elif current is not None:
            current.append(line)
    return {name: _Bash("".join(lines).removesuffix("\n")) for name, lines in sections.items()}


def _bash(section: str, **values: str) -> str:
    """job.sh.in's ``section`` with its ``@{name}``s filled in (every one of them: a missing one raises)."""
    return _sections()[section].substitute(values)


@dataclass(frozen=True)
class Dialect:
    """How the shared job body talks to its scheduler: the variables it reads, the commands it runs."""

    scheduler: str  # its name, in comments
    submit: str  # the header's how-to: the command that submits the file
    submit_dir: str  # variable naming the directory the job was submitted from
    job_id: str  # variable holding the job's id
    array_key: str  # shell words naming one array task
    scratch_key: str  # shell words naming the job (an array's task) on its nodes, unique among jobs there
    signals: str  # comment lines: who signals the batch shell, and when
    killed_by: str  # what cuts a script's copy-back short
    cancel_command: str  # how a user stops a job
    restarts: str  # shell expression: how often this job has been requeued before
    requeue: str  # shell lines, run after clean_up, that put the job back in the queue
    requeue_by_hand: str  # the command that requeues it once more
    cancel: str  # the line that ends a job stopped on request as cancelled ("": it ends by itself)
    rendezvous: str  # comment and shell lines setting rendezvous_host and rendezvous_port
    steps: bool  # srun runs commands across the job's nodes (multi-node jobs, one process per task)
    # A preemption's TERM is told from a cancel's (`scontrol show job`), and the scheduler requeues the job
    preemption: bool


SLURM = Dialect(
    scheduler="Slurm",
    submit="sbatch <this file>",
    submit_dir="SLURM_SUBMIT_DIR",
    job_id="SLURM_JOB_ID",
    # An array's tasks each have a run folder of their own, under one folder of the array.
    array_key="${SLURM_ARRAY_JOB_ID}/${SLURM_ARRAY_TASK_ID}",
    scratch_key="${SLURM_JOB_ID}",  # each array task has a job id of its own
    signals=(
        "# Slurm signals this shell: USR1 before the time limit, TERM on scancel, "
        "or TERM to this shell alone\n"
        "# (`scancel --batch --signal=TERM`, as `hpcbox cancel` does), TERM at a preemption's grace time's\n"
        "# end (USR1 as it is picked where the site sets send_user_signal). The trainer checkpoints on both."
    ),
    killed_by="Slurm's KillWait after scancel",
    cancel_command="scancel",
    restarts="${SLURM_RESTART_COUNT:-0}",
    requeue='scontrol requeue "$SLURM_JOB_ID"',
    requeue_by_hand="scontrol requeue ${SLURM_JOB_ID}",
    cancel='scancel "$SLURM_JOB_ID" || true',
    rendezvous=f"""\
# Several processes: on each node one srun task runs hpctrain.torchrun, which starts that node's trainer
# processes, passes USR1 and TERM on to them, and exits {CHECKPOINTED_EXIT} when they checkpointed.
# Static rendezvous: a fixed set of nodes, the store on the job's first node (this one). A node's rank is
# its index in the job, so global rank 0, which writes checkpoints and metrics, runs on this node, whose
# scratch is copied back.
job_nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
rendezvous_host=${{job_nodes%%$'\\n'*}}
rendezvous_port=$((20000 + SLURM_JOB_ID % 20000))""",
    steps=True,
    preemption=True,
)


@dataclass(frozen=True)
class JobInputs:
    """What earlier stages put on the cluster. Relative paths are relative to the submit directory."""

    sif: str
    code_dir: str
    dataset: str  # ONE archive (tar, optionally compressed), extracted on node scratch
    runs_dir: str  # each job's results land in <runs_dir>/<job id>
    log_dir: str  # where the log goes unless the job names its own path
    sif_sha256: str | None = None
    code_revision: str | None = None
    # An earlier job's run folder (absolute), whose results and checkpoints this job starts from.
    resume_from: str | None = None
    resumes: str | None = None  # that job, as people name it
    # This submission's own name (its script's), which marks its run folder as its own.
    submission: str | None = None

    @classmethod
    def defaults(cls, project: str, **given: str | None) -> JobInputs:
        """The layout under the submit directory (by convention ~/hpcbox/<project>), until ship sets it."""
        layout = {
            "sif": f"images/{project}.sif",
            "code_dir": "code",
            "dataset": f"data/{project}.tar",
            "runs_dir": "runs",
            "log_dir": "logs",
        }
        layout.update({key: value for key, value in given.items() if value})
        return cls(**layout)  # type: ignore[arg-type]


@dataclass(frozen=True)
class JobScript:
    text: str
    cluster: str
    resources: Resources
    inputs: JobInputs

    def write(self, path: Path) -> None:
        """Write the script atomically: a reader never sees half of it, a failure leaves nothing behind."""
        write_atomically(path, self.text, mode=0o755)

    @property
    def log_patterns(self) -> tuple[str, str | None]:
        return log_patterns(self.resources, self.inputs.log_dir)

    @property
    def overriding_environment(self) -> tuple[str, ...]:
        """The SBATCH_* variables sbatch would prefer to what this script says, which submit unsets:
        the script already holds what was asked for, by flag or by the environment hpcbox ran in."""
        written = {
            "account": self.resources.account,
            "partition": None if self.resources.partition.implicit else self.resources.partition.name,
            "qos": self.resources.qos,
        }
        return tuple(variable for name, variable in SBATCH_ENVIRONMENT.items() if written[name] is not None)

    def directories_to_create(self, user: str) -> tuple[str, ...]:
        """Made by the submit step as ``user``, before sbatch, relative to the submit directory."""
        return (*log_folders(self.resources, self.inputs, user), self.inputs.runs_dir)


def render_sbatch(
    profile: ClusterProfile,
    resources: Resources,
    inputs: JobInputs,
    trainer_args: tuple[str, ...] = (),
    command: ContainerCommand | Steps = EXAMPLE_TRAINER,
    sweep: Sweep | None = None,
) -> JobScript:
    """The job script: `command` with its configured arguments, then `trainer_args`, in the container;
    or each of several steps in turn, with its own arguments only. With a ``sweep``, an array task
    adds its point's arguments after those."""
    header = _headers(profile, resources, inputs)
    return job_script(
        profile, resources, inputs, trainer_args, command, header=header, dialect=SLURM, sweep=sweep
    )


def job_script(
    profile: ClusterProfile,
    resources: Resources,
    inputs: JobInputs,
    trainer_args: tuple[str, ...],
    command: ContainerCommand | Steps,
    *,
    header: str,
    dialect: Dialect,
    sweep: Sweep | None = None,
) -> JobScript:
    """The scheduler's ``header`` (its directives) over the body every scheduler's script shares."""
    for name in ("sif", "code_dir", "dataset", "runs_dir", "log_dir"):
        _check_path(f"inputs.{name}", getattr(inputs, name))
    if any(char in inputs.code_dir for char in ":,"):
        # Apptainer splits --bind specs at ':' and ','.
        raise FieldError("inputs.code_dir", f"{inputs.code_dir!r} contains ':' or ','")
    if command.ddp and resources.gpus:
        ddp_processes(resources.gpus, resources.ntasks_per_node)
    if isinstance(command, Steps) and trainer_args:
        raise FieldError(
            "trainer_args",
            f"the job runs {len(command.steps)} steps, each with the args of its [[tool.hpcbox.run.steps]] "
            "table: add the words after -- to the step that takes them",
        )
    if sweep is not None:
        _check_sweep(sweep, resources, command)
    for arg in trainer_args:
        if "\0" in arg:
            raise FieldError(
                "trainer_args", f"{arg!r} contains a NUL byte, which no program argument can hold"
            )
    sections = [
        header,
        _provenance(profile, inputs, log_folders(resources, inputs, _SOME_USER), dialect),
        "set -euo pipefail",
        _prelude(profile),
        _variables(profile, resources, inputs, dialect),
        _functions(profile, resources, inputs, command, dialect),
        _sweep_point(sweep) if sweep else "",
        _stage_in(profile, resources, inputs, dialect),
        _sampler(resources),
        _gpu_check(profile, resources, command, dialect),
        _syncer(resources.sync_every_s),
        _run_trainer(profile, resources, command, trainer_args, dialect, swept=sweep is not None),
        _finish(resources.max_restarts, dialect),
    ]
    text = "\n\n".join(section for section in sections if section) + "\n"
    return JobScript(text=text, cluster=profile.name, resources=resources, inputs=inputs)


def sbatch_quote(value: str) -> str:
    """Quote `value` the way sbatch reads #SBATCH lines: double quotes, with \\ and " escaped."""
    if _SBATCH_PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gpu_option(profile: ClusterProfile, resources: Resources) -> str | None:
    """The site's way of asking for GPUs: --gres=gpu[:type]:N or --gpus-per-node=[type:]N."""
    if not resources.gpus:
        return None
    typed = f"{resources.gpu_type}:{resources.gpus}" if resources.gpu_type else str(resources.gpus)
    if profile.gpu_request == "gres":
        return f"--gres=gpu:{typed}"
    return f"--gpus-per-node={typed}"


def render_shell(
    profile: ClusterProfile, resources: Resources, sif: str, code_dir: str, command: str | None = None
) -> str:
    """The login-node shell command for `hpcbox shell`: an allocation on a compute node (srun) running
    Apptainer on ``sif`` with the code at /code: `apptainer shell` on a terminal, or ``command``."""
    _check_path("sif", sif)
    _check_path("code_dir", code_dir)
    values = {**sbatch_values(resources, None, None), "nodes": "1"}
    options = []
    for option in RESOURCE_OPTIONS:
        if option.srun and values[option.name] is not None:
            options.append(f"{option.sbatch}={values[option.name]}")
        if option.name == "nodes":
            options.append("--ntasks=1")  # one task on one node: a shell, not the job's processes
    gpus = gpu_option(profile, resources)
    if gpus:
        options.append(gpus)
    apptainer = [_runtime(profile, resources), "shell" if command is None else "exec"]
    if resources.gpus:
        apptainer.append("--nv")
    for option in _container_options(profile, resources):
        apptainer += option
    for bind in _binds(profile, resources):
        apptainer += ["--bind", bind]
    apptainer += ["--bind", f"{code_dir}:{CODE_MOUNT}:ro", "--env", f"PYTHONPATH={CODE_MOUNT}", sif]
    if command is not None:
        apptainer += ["bash", "-c", command]
    srun = ["srun", *options, *(["--pty"] if command is None else []), *apptainer]
    setup = [line for line in (profile.prelude.strip(), *profile.apptainer.setup) if line]
    # Environment modules read unset variables: the same `set +u` the job script uses around them.
    return "\n".join(["set +u", *setup, "set -eu", shlex.join(srun)])


def log_patterns(resources: Resources, log_dir: str) -> tuple[str, str | None]:
    """The job's --output and --error patterns, as sbatch reads them (no --error: stderr goes to the
    log). The default log is `<log_dir>/<job name>-%j.out` (`%A_%a` for arrays)."""
    output = resources.log
    if output is None:
        job_key = "%A_%a" if resources.array else "%j"
        output = f"{logpaths.escape(log_dir.rstrip('/'))}/{slug(resources.job_name)}-{job_key}.out"
    return output, None if resources.error_log in (None, output) else resources.error_log


def log_folders(resources: Resources, inputs: JobInputs, user: str) -> tuple[str, ...]:
    """The folders the logs of ``user``'s job go to, which must exist before sbatch: Slurm writes no log
    into a missing one. Relative ones are under the submit directory."""
    patterns = [pattern for pattern in log_patterns(resources, inputs.log_dir) if pattern]
    folders = [logpaths.folder(pattern, resources.job_name, user) for pattern in patterns]
    return tuple(dict.fromkeys(folder for folder in folders if folder))


# Stands for the user in a folder of the script's own comment, where the shell says who it is; no
# pattern holds it (control characters are refused).
_SOME_USER = "\x00"


def _as_shell_word(folder: str) -> str:
    """``folder`` quoted for the shell, the user (``_SOME_USER``) as "$USER"."""
    return '"$USER"'.join(shlex.quote(part) if part else "" for part in folder.split(_SOME_USER))


def sbatch_values(resources: Resources, log: str | None, error_log: str | None) -> dict[str, str | None]:
    """Each resource option that becomes an sbatch option (its table's ``sbatch``), with its value as
    sbatch reads it; None: not written."""
    return {
        "job_name": resources.job_name,
        "partition": None if resources.partition.implicit else resources.partition.name,
        "nodes": str(resources.nodes),
        "ntasks_per_node": str(resources.ntasks_per_node),
        "cpus": str(resources.cpus_per_task) if resources.cpus_per_task else None,
        "mem": resources.mem,
        "time": format_time(resources.time_s) if resources.time_s is not None else None,
        "account": resources.account,
        "qos": resources.qos,
        "array": resources.array,
        "mail_user": resources.mail_user,
        "mail_type": resources.mail_type,
        "log": log,
        "error_log": error_log,
    }


def _headers(profile: ClusterProfile, resources: Resources, inputs: JobInputs) -> str:
    values = sbatch_values(resources, *log_patterns(resources, inputs.log_dir))
    options = [(option.sbatch, values[option.name]) for option in RESOURCE_OPTIONS if option.sbatch]
    options.append(("--signal", f"B:USR1@{resources.signal_margin_s}"))
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {name}={sbatch_quote(value)}" for name, value in options if value is not None]
    gpus = gpu_option(profile, resources)
    extra = list(resources.extra)
    site_gres = [option for option in extra if option.startswith("--gres=")]
    if gpus and gpus.startswith("--gres=") and site_gres:
        # sbatch keeps only the last --gres: the GPUs and the site's other resources share one.
        gpus = ",".join([gpus, *(option.partition("=")[2] for option in site_gres)])
        extra = [option for option in extra if option not in site_gres]
    if gpus:
        lines.append(f"#SBATCH {gpus}")
    # A requeued job writes on in the same log rather than truncating its earlier run's output.
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    for option in extra:
        name, has_value, value = option.partition("=")
        lines.append(f"#SBATCH {name}={sbatch_quote(value)}" if has_value else f"#SBATCH {name}")
    return "\n".join(lines)


def _provenance(
    profile: ClusterProfile, inputs: JobInputs, log_folders: tuple[str, ...], dialect: Dialect
) -> str:
    folders = " ".join(_as_shell_word(folder) for folder in log_folders)
    make_folders = f"mkdir -p {_comment(folders)} && " if log_folders else ""
    return "\n".join(
        [
            f"# Rendered by hpcbox for cluster {_comment(profile.name)}: re-render it, rather than edit it.",
            "# Submit it from the directory the relative paths below start at, once the log folder exists:",
            f"#   {make_folders}{dialect.submit}",
            f"# sif: {_comment(inputs.sif)}",
            f"# sif sha256: {_comment(inputs.sif_sha256 or 'unknown')}",
            f"# code revision: {_comment(inputs.code_revision or 'unknown')}",
            *([f"# {_comment(assumed)}"] if (assumed := assumptions(profile)) else []),
        ]
    )


def _prelude(profile: ClusterProfile) -> str:
    lines = []
    if profile.prelude.strip():
        lines += ["# Site prelude (from the cluster profile).", profile.prelude.strip()]
    if profile.apptainer.setup:
        # Environment modules (Lmod) read unset variables, which `set -u` turns into errors.
        lines += ["# Make the container runtime available.", "set +u", *profile.apptainer.setup, "set -u"]
    return "\n".join(lines)


def _variables(profile: ClusterProfile, resources: Resources, inputs: JobInputs, dialect: Dialect) -> str:
    job_key = dialect.array_key if resources.array else f"${{{dialect.job_id}}}"
    return "\n".join(
        [
            f"submit_dir=${{{dialect.submit_dir}:-$PWD}}",
            f"sif={_path(inputs.sif)}",
            f"code_dir={_path(inputs.code_dir)}",
            f"dataset={_path(inputs.dataset)}",
            f'job_key="{job_key}"',
            f'run_dir={_path(inputs.runs_dir)}/"$job_key"',
            # W&B's run id (WANDB_RUN_ID): one a submission and task, the same in each run of a requeue.
            f'tracking_id={shlex.quote(_submission_stem(inputs) + "-")}"${{job_key//\\//-}}"',
            *([f"resume_from={shlex.quote(inputs.resume_from)}"] if inputs.resume_from else []),
            *([f"submission={shlex.quote(inputs.submission)}"] if inputs.submission else []),
            f"job_scratch={job_scratch(profile, dialect)}",
            'trainer_pid=""',
            'sampler_pid=""',
            'syncer_pid=""',
            'terminated=""',
            'cleaned=""',
            *(['janitor_pid=""'] if dialect.steps else []),
            # USR1 came: a trainer or step that has not started waits for the requeued job.
            'time_up=""',
            *(['preemption=""'] if dialect.preemption else []),
        ]
    )


def job_scratch(profile: ClusterProfile, dialect: Dialect = SLURM) -> str:
    """The job's folder on node scratch, as bash on the job's nodes expands it (in the job script, and
    in any step of the job: `hpcbox notebook` reads the notebook's files there)."""
    scratch_variable = profile.node_scratch_variable
    if scratch_variable:
        node_scratch = f'"${{{scratch_variable}:?the site sets {scratch_variable} for every job}}"'
    else:
        node_scratch = shlex.quote(profile.node_scratch) + '/"${USER:-$(id -un)}"'
    return f'{node_scratch}/hpcbox-"{dialect.scratch_key}"'


def _functions(
    profile: ClusterProfile,
    resources: Resources,
    inputs: JobInputs,
    command: ContainerCommand | Steps,
    dialect: Dialect,
) -> str:
    each_node = f'{_SRUN_EACH_NODE} "$@"' if resources.nodes > 1 else '"$@"'
    janitor_cleanup = _bash("janitor_cleanup") if dialect.steps else ""
    signal_trainer = 'kill -s "$signal" "$trainer_pid" 2>/dev/null || true'
    signal_job = ""
    if resources.tasks > 1 and dialect.steps:
        signal_job = _bash("signal_job_definition", signal_job=shlex.quote(_bash("signal_job")))
        to_whom, pattern = (
            ("each node's torchrun, which tells its ranks", "^([^ ]*/)?python[0-9.]* -m hpctrain[.]torchrun ")
            if command.ddp
            else ("each task's process on every node", command.process_pattern())
        )
        signal_trainer = (
            f"# To {to_whom}: srun would signal every process of\n"
            "        # the step, and the squashfuse serving the SIF (unprivileged Apptainer) dies of it.\n"
            "        # After a plain scancel no step can start, but Slurm has signalled every process.\n"
            "        if [[ $signal == USR1 || $signal == TERM ]]; then\n"
            f'            on_each_node bash -c "$signal_job" signal "$signal" "${{{dialect.job_id}}}" \\\n'
            f"                {shlex.quote(pattern)} || true\n"
            "        fi"
        )
    retry = (
        "# Slurm can refuse a new step on nodes whose previous step is still being torn down."
        if dialect.steps
        else "# A removal can fail while a process of the job still holds a file open."
    )
    return _bash(
        "functions",
        each_node=each_node,
        signal_job=signal_job,
        killed_by=dialect.killed_by,
        cancel_command=dialect.cancel_command,
        janitor_cleanup=janitor_cleanup,
        mark_run_dir=f'\n    printf \'%s\\n\' "$submission" >"$run_dir/{SUBMISSION_FILE}"'
        if inputs.submission
        else "",
        retry=retry,
        signals=dialect.signals,
        preemption=_bash("preemption") + "\n\n" if dialect.preemption else "",
        picked_branch=_bash("picked_branch") + "\n" if dialect.preemption else "",
        preempted_branch=_bash("preempted_branch") + "\n" if dialect.preemption else "",
        signal_trainer=signal_trainer,
    )


def _stage_in(profile: ClusterProfile, resources: Resources, inputs: JobInputs, dialect: Dialect) -> str:
    sif_dir = copy_sif = janitor = unpack_sif = resume = ""
    if inputs.resume_from is not None:
        resume = _bash("resume", earlier=inputs.resumes or "an earlier one", outcome=OUTCOME_FILE) + "\n"
    if dialect.steps:
        janitor = "".join(
            f"{line}\n"
            for line in [
                "# Scratch goes however the job ends, even where no new step can start or this script",
                "# itself is killed (Slurm enforcing --mem without cgroups kills the whole batch step).",
                "# shellcheck disable=SC2016  # expanded by the shell on each node",
                f"janitor={shlex.quote(_bash('janitor'))}",
                f"{_SRUN_EACH_NODE} --job-name=hpcbox-janitor "
                'bash -c "$janitor" janitor "$SLURMD_NODENAME" "$$" \\\n    "$job_scratch" </dev/null &',
                "janitor_pid=$!",
            ]
        )
    if resources.container.sif_on_scratch:
        sif_dir = ' "$job_scratch/sif"'
        copy_sif = "\n" + "\n".join(
            [
                "# The SIF on node-local disk too, one copy per node: the shared file system serves it once",
                "# per node, not to every process the job starts. Cleaning scratch removes the copies.",
                'on_each_node cp -- "$sif" "$job_scratch/sif/"',
                'sif="$job_scratch/sif/${sif##*/}"',
                'echo "hpcbox: each node runs its copy of the SIF, $sif" >&2',
            ]
        )
    runtime = _runtime(profile, resources)
    if resources.container.unpack_sif is not False:
        sif_dir = ' "$job_scratch/sif"'
        decide = (
            _bash("unpack_always")
            if resources.container.unpack_sif
            else _bash("unpack_where_needed", runtime=runtime)
        )
        unpack_sif = "\n" + _bash("unpack_sif", runtime=runtime, decide=decide)
    setup = profile.prelude.strip() or profile.apptainer.setup
    runtime_check = _bash(
        "runtime_check",
        runtime=runtime,
        after_setup=" after the profile's setup" if setup else "",
        setup=", setup" if setup else "",
    )
    own_run_dir = _bash("own_run_dir", marker=SUBMISSION_FILE) + "\n" if inputs.submission else ""
    return _bash(
        "stage_in",
        runtime_check=runtime_check + "\n",
        own_run_dir=own_run_dir,
        job_id=dialect.job_id,
        janitor=janitor,
        sif_dir=sif_dir,
        copy_sif=copy_sif,
        unpack_sif=unpack_sif,
        resume=resume,
        outcome=OUTCOME_FILE,
    )


def _sampler(resources: Resources) -> str:
    if not resources.gpus:
        return ""
    return _bash("sampler", interval=str(GPU_SAMPLE_INTERVAL_S))


# Run in the container by a job given GPUs: exit 3 when its PyTorch cannot use them (stop), 0 otherwise,
# also where there is no PyTorch to ask (a program of another framework decides for itself). No single
# quote in it: the script holds it in one.
_GPU_CHECK = """import sys
given, placeholders = int(sys.argv[1]), sys.argv[2] == "1"
try:
    import torch
except ImportError:
    sys.exit(0)
if torch.version.cuda is None:
    problem = f"its PyTorch ({torch.__version__}) is a CPU build"
elif torch.cuda.device_count() < given and not placeholders:
    problem = f"its PyTorch sees {torch.cuda.device_count()} (no --nv, or no NVIDIA driver on the node)"
else:
    sys.exit(0)
gpus = f"{given} GPU" + ("s" if given > 1 else "")
print(
    f"hpcbox: this job was given {gpus}, but {problem}: its program would run on the CPU while holding "
    "them, so it does not start; submit it in the cuda flavour",
    file=sys.stderr,
)
sys.exit(3)"""


def _gpu_check(
    profile: ClusterProfile, resources: Resources, command: ContainerCommand | Steps, dialect: Dialect
) -> str:
    """The check a Slurm job given GPUs makes before its program starts; the example trainer makes it
    itself (hpctrain.distributed), where --device cpu can overrule it."""
    if not resources.gpus or not dialect.steps or command == EXAMPLE_TRAINER:
        return ""
    container = [shlex.join(option) for option in _container_options(profile, resources)]
    words = [f"{_runtime(profile, resources)} exec --nv", *container]
    words += ['"$sif" python3 -c "$gpu_check"', '"$SLURM_GPUS_ON_NODE" "${HPCBOX_PLACEHOLDER_GPUS:-}"']
    return _bash("gpu_check", program=shlex.quote(_GPU_CHECK), check="    " + " ".join(words))


def _submission_stem(inputs: JobInputs) -> str:
    return inputs.submission.removesuffix(".sh") if inputs.submission else "hpcbox"


def _tracking_environment(profile: ClusterProfile) -> list[str]:
    """Where experiment trackers keep their runs, unless the job's environment says otherwise: in the
    output folder, which comes home (their defaults, wandb/ and mlruns/ in the working directory, are
    on node scratch and go with it). A W&B run keeps one id across the job's requeues (the job script's
    `tracking_id`), resumed where it exists: its curves go on in one run, and offline runs of one job
    sync as one. Where the profile says the compute nodes reach no internet, W&B runs offline (`wandb
    sync` from home later) and Hugging Face's hub is not tried."""
    environment = {
        "WANDB_RUN_ID": "$tracking_id",
        "WANDB_RESUME": "allow",
        "WANDB_DIR": OUTPUT_DIR,
        "MLFLOW_TRACKING_URI": f"file://{OUTPUT_DIR}/mlruns",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 keeps its file store for this behind a switch
    }
    if profile.compute_internet is False:
        environment |= {"WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return [f'--env "{name}=${{{name}:-{value}}}"' for name, value in environment.items()]


def _syncer(every_s: int) -> str:
    if not every_s:
        return ""
    live_s = min(LIVE_COPY_S, max(every_s // 4, 1))
    return _bash("syncer", every_s=str(every_s), live_s=str(live_s), live_kib=str(LIVE_FILE_KIB))


def _check_sweep(sweep: Sweep, resources: Resources, command: ContainerCommand | Steps) -> None:
    if isinstance(command, Steps):
        raise FieldError(
            "sweep", "the job runs steps, each with its own arguments: a sweep's point has no step to go to"
        )
    if resources.array not in (sweep.array(), None) and not _selects_points(resources.array, sweep):
        raise FieldError("array", f"{resources.array!r} names tasks the sweep {sweep.source} does not have")


def _selects_points(array: str | None, sweep: Sweep) -> bool:
    """Whether every task id ``array`` names is a point of ``sweep`` (a resubmission of some)."""
    spec = (array or "").split("%")[0]
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) >= len(sweep.points):
            return False
    return True


def _sweep_point(sweep: Sweep) -> str:
    cases = "\n".join(
        f"    {index}) point_args=({shlex.join(args)}) ;;" for index, args in enumerate(sweep.points)
    )
    count = len(sweep.points)
    literal = any("$" in arg or "`" in arg for point in sweep.points for arg in point)
    disable = "# shellcheck disable=SC2016  # the sweep's arguments are meant literally\n" if literal else ""
    return _bash("sweep_point", source=_comment(sweep.source), disable=disable, cases=cases, count=str(count))


def _run_trainer(
    profile: ClusterProfile,
    resources: Resources,
    command: ContainerCommand | Steps,
    trainer_args: tuple[str, ...],
    dialect: Dialect,
    *,
    swept: bool = False,
) -> str:
    if isinstance(command, Steps):
        return _run_steps(profile, resources, command, dialect)
    text = _before_launch(profile, resources, command, dialect) + _launch(
        profile, resources, command, trainer_args, dialect, swept=swept
    )
    return _bash(
        "run_trainer",
        scheduler=dialect.scheduler,
        launch=text,  # not indented: an argument may hold a newline, which indenting would change
        checkpointed=str(CHECKPOINTED_EXIT),
        as_it_started=textwrap.indent(_bash("usr1_as_it_started"), "    "),
        await_trainer=textwrap.indent(_await_trainer("trainer"), "    "),
    )


def _run_steps(profile: ClusterProfile, resources: Resources, run: Steps, dialect: Dialect) -> str:
    total = len(run.steps)
    blocks = []
    for number, step in enumerate(run.steps, 1):
        launch = _launch(profile, resources, step.command, (), dialect)
        # The launch is not indented: an argument may hold a newline, which indenting would change.
        after = textwrap.indent(f"trainer_pid=$!\n{_bash('usr1_as_it_started')}\nawait_step {number}", "    ")
        blocks.append(f"if start_step {number} {shlex.quote(step.name)}; then\n{launch} &\n{after}\nfi")
    return _bash(
        "run_steps",
        before=_before_launch(profile, resources, run, dialect),
        total=str(total),
        scheduler=dialect.scheduler,
        checkpointed=str(CHECKPOINTED_EXIT),
        await_step=textwrap.indent(_await_trainer("step"), "    "),
        blocks="\n".join(blocks),
    )


def _await_trainer(what: str) -> str:
    """Waits for $trainer_pid, leaving its exit status in $status."""
    return _bash("await", what=what)


def _before_launch(
    profile: ClusterProfile, resources: Resources, command: ContainerCommand | Steps, dialect: Dialect
) -> str:
    """What the launch lines need first: the notebook's token, the rendezvous for torchrun on several
    processes."""
    if command == NOTEBOOK:
        # Apptainer hands APPTAINERENV_X to the container as X; Singularity, SINGULARITYENV_X.
        runtime = _runtime(profile, resources)
        prefix = "SINGULARITYENV_" if Path(runtime.split()[0]).name == "singularity" else "APPTAINERENV_"
        return (
            _bash(
                "notebook_token",
                prefix=prefix,
                runtime_dir=NOTEBOOK_RUNTIME_DIR,
                runtime_mount=f"{SCRATCH_MOUNT}/{NOTEBOOK_RUNTIME_DIR}",
                config_dir=NOTEBOOK_CONFIG_DIR,
                config_mount=f"{SCRATCH_MOUNT}/{NOTEBOOK_CONFIG_DIR}",
            )
            + "\n"
        )
    if resources.tasks == 1:
        return ""
    if command.ddp:
        return dialect.rendezvous + "\n"
    return "# Several processes, not DDP: srun starts one per Slurm task, each in a container.\n"


def _launch(
    profile: ClusterProfile,
    resources: Resources,
    command: ContainerCommand,
    trainer_args: tuple[str, ...],
    dialect: Dialect,
    *,
    swept: bool = False,
) -> str:
    """The command line that starts ``command``'s processes in the container, one option to a line."""
    runtime = _runtime(profile, resources)
    multi_process = resources.tasks > 1
    torchrun = multi_process and command.ddp
    # Each unit is one option with its value, kept together on a line.
    if not multi_process or not dialect.steps:
        # Without steps the job has one node (resources.resolve sees to it): torchrun starts there.
        units = [f"{runtime} exec"]
    elif torchrun:
        units = _per_node_launch(resources, runtime)
    else:
        units = _per_task_launch(resources, runtime)
    if resources.gpus:
        units.append("--nv")
    units += [shlex.join(option) for option in _container_options(profile, resources)]
    if profile.apptainer.workdir_on_scratch:
        units.append('--workdir "$job_scratch/tmp"')
    units += [f"--bind {shlex.quote(bind)}" for bind in _binds(profile, resources)]
    units += [
        f'--bind "$job_scratch:{SCRATCH_MOUNT}"',
        f'--bind "$code_dir:{CODE_MOUNT}:ro"',
        f"--env PYTHONPATH={CODE_MOUNT}",
    ]
    # As many threads per process as it has CPUs, unless the job's environment says otherwise: PyTorch
    # and NumPy otherwise start one per core of the node, far more than a job's share of a shared node.
    units.append(f'--env "OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{resources.cpus_per_task or 1}}}"')
    if multi_process:
        # The trainer sizes its DataLoader workers by this: the CPUs of one process, not of the node.
        units.append(f"--env SLURM_CPUS_PER_TASK={resources.cpus_per_task or 1}")
    if multi_process and dialect.steps:
        units.append(f'--env "HPCBOX_JOB=${{{dialect.job_id}}}"')  # how signal_job tells the job's processes
    if torchrun:
        units.append(f"--env HPCTRAIN_STOP_WITHIN_S={stop_within_s(resources)}")
    units += _tracking_environment(profile)
    units += [f"--pwd {SCRATCH_MOUNT}", '"$sif"']
    if torchrun:
        units += [*_torchrun(resources), *_command_units(command.torchrun_words(), command.resolved_args())]
    else:
        units += _command_units(command.program_words(), command.resolved_args())
    point = ['"${point_args[@]}"'] if swept else []
    text = " \\\n    ".join(_wrap(units + [shlex.quote(arg) for arg in trainer_args] + point))
    arguments = command.args + trainer_args
    literal = [
        *([f"the per-{'node' if torchrun else 'task'} shell's"] if multi_process and dialect.steps else []),
        *(["the trainer's arguments"] if any("$" in arg or "`" in arg for arg in arguments) else []),
    ]
    if literal:
        text = f"# shellcheck disable=SC2016  # {' and '.join(literal)} are meant literally\n" + text
    return text


def _runtime(profile: ClusterProfile, resources: Resources) -> str:
    return resources.container.command or profile.apptainer.command


def _container_options(profile: ClusterProfile, resources: Resources) -> list[list[str]]:
    """The profile's container options, then the job's: each option with its value."""
    job = resources.container
    switches = (("--cleanenv", job.cleanenv), ("--no-home", job.no_home))
    options = [[option] for option in profile.apptainer.options]
    options += [[flag] for flag, wanted in switches if wanted]
    return options + ([["--home", job.home]] if job.home else [])


def _binds(profile: ClusterProfile, resources: Resources) -> list[str]:
    return [*profile.apptainer.binds, *resources.container.binds]


def stop_within_s(resources: Resources) -> int:
    """Seconds the ranks have, once the time limit's signal came, to checkpoint and exit: half the
    margin, the other half being the copy-back's. Each node's torchrun ends its workers still running
    then and exits 75 (HPCTRAIN_STOP_WITHIN_S), so a rank that cannot answer (its peers gone, stuck in a
    collective) costs the job its last minutes of training, never its requeue."""
    return resources.signal_margin_s // 2


def _per_node_launch(resources: Resources, apptainer_command: str) -> list[str]:
    """srun, one task per node with all the node's CPUs, and a shell there that knows its node's index.

    Not --kill-on-bad-exit: a node whose trainers checkpointed exits 75 moments before the others, and
    killing those would turn the step's 75 into a failure. A node that fails leaves the others waiting
    in a collective: --wait ends them a minute after the first task exits, or once the ranks' time to
    stop (`stop_within_s`) has passed, whichever is later: rank 0's node may still be writing the
    checkpoint when the others have exited 75. --mem=0 gives the step the job's memory without taking
    it from the job, so that on_each_node can still start steps beside it.
    """
    cpus = resources.ntasks_per_node * (resources.cpus_per_task or 1)
    # SLURM_NODEID is set on each node; --env passes it through Apptainer's --containall too.
    per_node = 'exec "$1" exec --env "PET_NODE_RANK=$SLURM_NODEID" "${@:2}"'
    return [
        f"srun --nodes={resources.nodes}",
        f"--ntasks={resources.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        "--mem=0",
        "--kill-on-bad-exit=0",
        f"--wait={max(60, stop_within_s(resources) + 15)}",
        f"bash -c {shlex.quote(per_node)} per-node",
        shlex.quote(apptainer_command),
    ]


def _per_task_launch(resources: Resources, apptainer_command: str) -> list[str]:
    """srun, one task per process as Slurm counts them, each told its place in the job.

    The task's Slurm identity goes in through --env, which Apptainer's --containall keeps; the step
    runs with --kill-on-bad-exit=0 --wait=60 and --mem=0 for the reasons _per_node_launch gives.
    """
    identity = " ".join(f'--env "{name}=${name}"' for name in SLURM_TASK_IDENTITY)
    per_task = f'exec "$1" exec {identity} "${{@:2}}"'
    return [
        f"srun --nodes={resources.nodes}",
        f"--ntasks={resources.tasks}",
        f"--ntasks-per-node={resources.ntasks_per_node}",
        f"--cpus-per-task={resources.cpus_per_task or 1}",
        "--mem=0",
        "--kill-on-bad-exit=0",
        "--wait=60",
        f"bash -c {shlex.quote(per_task)} per-task",
        shlex.quote(apptainer_command),
    ]


def _torchrun(resources: Resources) -> list[str]:
    return [
        "python -m hpctrain.torchrun",
        f"--nnodes={resources.nodes}",
        f"--nproc-per-node={resources.ntasks_per_node}",
        "--rdzv-backend=static",
        '--master-addr="$rendezvous_host"',
        '--master-port="$rendezvous_port"',
    ]


def _command_units(head: tuple[str, ...], args: tuple[str, ...]) -> list[str]:
    """Quoted words grouped for reading: the program on one line, then each option with its values."""
    units = [[shlex.quote(word) for word in head]]
    for arg in args:
        if arg.startswith("-"):
            units.append([])
        units[-1].append(shlex.quote(arg))
    return [" ".join(unit) for unit in units]


def _finish(max_restarts: int, dialect: Dialect) -> str:
    # A scheduler whose jobs end by themselves once stopped needs no cancel of its own.
    stopped = _bash("stopped_then_cancelled", cancel=dialect.cancel) if dialect.cancel else _bash("stopped")
    checkpointed = str(CHECKPOINTED_EXIT)
    preempted_finish = (
        _bash("preempted_finish", checkpointed=checkpointed) + "\n" if dialect.preemption else ""
    )
    return _bash(
        "finish",
        checkpointed=checkpointed,
        restarts=dialect.restarts,
        max_restarts=str(max_restarts),
        job=f"${{{dialect.job_id}}}",
        requeue=textwrap.indent(dialect.requeue, " " * 8),
        requeue_by_hand=dialect.requeue_by_hand,
        stopped=stopped,
        outcome=OUTCOME_FILE,
        stop_signal="time limit's or preemption's signal" if dialect.preemption else "time limit's signal",
        preempted_finish=preempted_finish,
    )


def _wrap(words: list[str], width: int = 100) -> list[str]:
    """Group words into continuation lines of at most `width` characters."""
    lines: list[str] = []
    current: list[str] = []
    for word in words:
        if current and len(" ".join([*current, word])) > width:
            lines.append(" ".join(current))
            current = []
        current.append(word)
    if current:
        lines.append(" ".join(current))
    return lines


def _path(path: str) -> str:
    """A shell word for `path`: absolute as is, relative under the submit directory."""
    if path.startswith("/"):
        return shlex.quote(path)
    return '"$submit_dir"/' + shlex.quote(path)


def _check_path(field_name: str, value: str) -> None:
    if not value or any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in value):
        raise FieldError(field_name, f"{value!r} is empty or contains control characters")


def _comment(text: str) -> str:
    """Text safe inside a comment line: no line breaks."""
    return "".join(" " if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char for char in text)
