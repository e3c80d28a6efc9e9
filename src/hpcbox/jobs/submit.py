"""Submit a job: the earlier stages' artifacts (the environment's SIF, the code snapshot, the dataset),
shipped where the cluster lacks them, the job script rendered with the shipped paths and `sbatch`ed,
the job recorded in the ledger."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpcbox import store
from hpcbox.build.image import CUDA_FLAVOURS, ENVIRONMENT, Image, build_image, last_image, resolve_flavour
from hpcbox.build.provenance import inputs_revision
from hpcbox.errors import HpcboxError
from hpcbox.files import slug
from hpcbox.jobs import identity
from hpcbox.jobs.connect import require_slurm
from hpcbox.jobs.fetch import has_results, shown_run_dir
from hpcbox.ledger import JobRecord, Ledger
from hpcbox.minicluster.cluster import Cluster
from hpcbox.project.command import EXAMPLE_DATASET, EXAMPLE_TRAINER, NOTEBOOK, ContainerCommand, Steps
from hpcbox.project.config import ProjectConfig
from hpcbox.render import logpaths
from hpcbox.render.profiles import ClusterProfile
from hpcbox.render.resources import Resources
from hpcbox.render.sbatch import JobInputs, JobScript, render_sbatch
from hpcbox.render.sweep import Sweep
from hpcbox.sif.compression import SifCompression
from hpcbox.store import ship
from hpcbox.survey import doctor
from hpcbox.tools import slurm, ssh


def prepare_payload(
    project: ProjectConfig,
    data: Path | None,
    compression: SifCompression,
    *,
    flavour: str | None = None,
    offline: bool = False,
    cache: Path | None = None,
    data_cache: Path | None = None,
    gpus: int = 0,
    target: str = ENVIRONMENT,
    before_work: Callable[[], None] = lambda: None,
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> tuple[ship.Payload, Image]:
    """The earlier stages, each a no-op when nothing changed: the environment image (the project's
    image without its code), its SIF at ``compression`` (what the target cluster reads), the code
    snapshot and the dataset's digest (a dataset directory's archive first, made once).

    The flavour and base are those `hpcbox build` last used, unless given; a job asking for ``gpus``
    refuses a flavour without CUDA it did not name, before building where it can tell (one it named
    goes, and the trainer stops at the job's start unless told --device cpu). ``cache``: the SIF cache
    (default: $HPCBOX_CACHE/sif, else the project's .hpcbox/sif); ``data_cache``: the dataset
    directories' archives (default: $HPCBOX_CACHE/data, else the project's .hpcbox/data). ``target``
    NOTEBOOK: the environment with JupyterLab (`hpcbox notebook`). ``before_work``: called once the
    input is checked, before any archive, build or conversion (submit connects to the login there).
    """
    from hpcbox.sif.convert import build_sif
    from hpcbox.store.datasets import cache_dir

    # Bad input first, before anything is built.
    base = None
    if flavour is None and not offline:
        try:
            recorded = last_image(project)
        except HpcboxError:
            recorded = None
        if recorded is not None:
            flavour, base = recorded.flavour, recorded.base
            _require_cuda(flavour, gpus, "the flavour `hpcbox build` last made")
    if flavour is None:
        _require_cuda(
            resolve_flavour(flavour, offline).name, gpus, "the flavour --offline builds unless told"
        )
    elif gpus and flavour not in CUDA_FLAVOURS:
        say(
            f"hpcbox: the job asks for GPUs in the {flavour} flavour, as asked: the example trainer stops at "
            "its start unless told --device cpu"
        )
    ship.check_dataset(data)
    before_work()
    dataset = ship.dataset(data, data_cache or cache_dir(project.root), say)
    code = ship.code_snapshot(project)
    environment = build_image(
        project, flavour=flavour, offline=offline, base=base, target=target, say=say, on_line=on_line
    )
    if flavour is None:
        _require_cuda(environment.flavour, gpus, "the flavour this machine could build")
    sif = build_sif(environment, compression=compression, cache=cache, say=say, on_line=on_line)
    payload = ship.Payload(
        sif.path, sif.sha256, sif.size, code, dataset, environment.flavour, sif.compression
    )
    return payload, environment


def _require_cuda(flavour: str, gpus: int, which: str) -> None:
    """A GPU job in an environment without CUDA would hold its GPUs and train on the CPU."""
    if gpus and flavour not in CUDA_FLAVOURS:
        raise HpcboxError(
            f"the job asks for {gpus} GPU{'s' if gpus > 1 else ''}, but its environment is the {flavour} "
            f"flavour ({which}), which has no CUDA: it would train on the CPU",
            "pass --flavour cuda (it builds offline too), or leave out --gpus for a CPU job "
            "(--flavour cpu asks for it knowingly)",
        )


def submit(
    project: ProjectConfig,
    profile: ClusterProfile,
    target: ssh.Target,
    resources: Resources,
    trainer_args: tuple[str, ...],
    payload: ship.Payload,
    *,
    image: str,
    via: str | None = None,
    remote_root: str = ship.DEFAULT_REMOTE_ROOT,
    dry_run: bool = False,
    sweep: Sweep | None = None,
    resubmits: str | None = None,
    command: ContainerCommand | None = None,
    connection: ssh.Connection | None = None,
    mini: Cluster | None = None,
    resume_from: JobRecord | None = None,
    before_upload: Callable[[], None] | None = None,
    options: Mapping[str, Any] | None = None,
    say: Callable[[str], None] = print,
) -> JobRecord | None:
    """Ship, render, sbatch and record the job; with ``dry_run`` say what would happen and do nothing.

    With a ``sweep`` the job is an array, a task per point (``resources.array`` names which). ``command``:
    what the job runs instead of the project's program (NOTEBOOK); ``connection``: one to ``target``
    already open, to use (and leave open) rather than a connection of its own; ``mini``: the mini
    cluster ``target`` is, whose life the record names (identity.gone); ``resume_from``: an earlier job
    there, whose results and checkpoints the job starts from (copied on the cluster, not sent again);
    ``before_upload``: `ship.ship`'s; ``options``: the resource options given for it, kept in its record
    (a rerun or a resumed job takes them)."""
    require_slurm(profile)
    started = time.monotonic()
    # From the command that ends in sbatch until the job is recorded, Ctrl-C, SIGTERM and SIGHUP wait
    # (ssh.Connection.uninterrupted), then take effect: no job is sent without its record here.
    holding: list[list[str]] = []  # the signals held, once sbatch's command starts
    with contextlib.ExitStack() as until_recorded:
        with (
            ssh.Connection(target) if connection is None else contextlib.nullcontext(connection) as connection
        ):
            connected = time.monotonic()
            if not dry_run:
                doctor.first_look(connection, profile, project.state_dir, say=say)
            if resume_from is not None:
                _require_results(connection, resume_from)
            looked = time.monotonic()
            code_revision = inputs_revision(project.root, project.code)
            if code_revision and code_revision.endswith("-dirty"):
                say(
                    f"hpcbox: the code has changes not committed (recorded as {code_revision}): the job runs "
                    "them, and no commit holds what it ran"
                )
            rendered: list[tuple[JobScript, str, datetime]] = []

            def render(remote: ship.Remote) -> tuple[JobScript, str, datetime]:
                """The job script with the shipped paths, its name, and when: once the uploads are done."""
                stamp = datetime.now(UTC)
                name = f"{slug(resources.job_name)}-{stamp:%Y%m%dT%H%M%S}-{payload.code.name[:8]}.sh"
                inputs = JobInputs(
                    sif=remote.sif,
                    code_dir=remote.code_dir,
                    dataset=remote.dataset,
                    runs_dir="runs",
                    log_dir="logs",
                    sif_sha256=payload.sif_sha256,
                    code_revision=code_revision,
                    resume_from=resume_from and resume_from.run_dir,
                    resumes=resume_from and resume_from.run,
                    submission=name,
                )
                script = render_sbatch(
                    profile, resources, inputs, trainer_args, command or project.run, sweep=sweep
                )
                rendered.append((script, name, stamp))
                return rendered[-1]

            def waiting(name: str) -> None:
                say(
                    f"hpcbox: {name}: stopping once the job being sent is recorded (again: at once, "
                    "which may leave it running unknown to hpcbox)"
                )

            def sbatch(remote: ship.Remote) -> ship.Then:
                """sbatch at the end of ship's last command (one round trip fewer than a command of its
                own), which no Ctrl-C cuts short."""
                holding.append(until_recorded.enter_context(connection.uninterrupted(until_again=waiting)))
                script, name, _ = render(remote)
                text = script.text.encode()
                return ship.Then(
                    slurm.submit_script(
                        remote.submit_dir,
                        name,
                        len(text),
                        script.directories_to_create(remote.user),
                        unset=script.overriding_environment,
                    ),
                    "submit the job with sbatch",
                    text,
                    (slurm.SBATCH_REFUSED,),
                )

            remote = ship.ship(
                connection,
                payload,
                project.name,
                root=remote_root,
                previous=_last_job_on(project, target),
                access=store.Access(profile.store.group),
                dry_run=dry_run,
                then=sbatch,
                before_upload=before_upload,
                say=say,
            )
            if dry_run:
                script, script_name, _ = render(remote)
                say(f"hpcbox: would run `sbatch --parsable scripts/{script_name}` in {remote.submit_dir}:")
                say(script.text)
                return None
            assert remote.then_done is not None  # sbatch ended ship's last command
            job_id = slurm.submitted(remote.then_done)
            script, script_name, stamp = rendered[-1]
            shipped = time.monotonic()
        timings = {
            "connect": round(connected - started, 3),
            "first_look": round(looked - connected, 3),
            "ship and sbatch": round(shipped - looked, 3),
        }
        record = _record(
            profile,
            remote,
            script,
            script_name,
            job_id,
            remote.user,
            stamp,
            payload,
            image,
            trainer_args,
            timings,
        )
        record = replace(
            record,
            via=via,
            sweep=sweep.points if sweep else (),
            resubmits=resubmits,
            notebook=command == NOTEBOOK,
            mini_cluster=mini and mini.name,
            incarnation=mini and mini.incarnation.id,
            resumes=resume_from and resume_from.run,
            options=json.loads(json.dumps(dict(options or {}))),
        )
        if mini is not None:
            identity.note_project(mini, project)
        ledger = Ledger(project)
        record = ledger.add(record, script.text)
        if record.run != job_id:
            taken = _taken(project, ledger, record)
            say(f"hpcbox: job {job_id}'s results go to {shown_run_dir(project, record)} here: {taken}")
    if held := [name for names in holding for name in names]:
        with contextlib.suppress(OSError):  # said on a terminal that is gone (SIGHUP)
            say(
                f"hpcbox: {held[0]} came while job {record.run} was being sent: it was sent and is "
                f"recorded (`hpcbox cancel -j {record.run}` stops it)"
            )
        signal.raise_signal(signal.Signals[held[0]])
    return record


def _taken(project: ProjectConfig, ledger: Ledger, record: JobRecord) -> str:
    """Why ``record``'s run is not named by its job id alone: what holds that name here."""
    earlier = ledger.earlier(record)
    if not earlier:
        held = shown_run_dir(project, replace(record, run_name=None))
        return f"{held} holds files of no job in this project's ledger"
    gone = identity.gone(earlier[-1], project)
    return f"an earlier {gone or f'job {earlier[-1].run}, submitted at {earlier[-1].submitted_at}'}"


def _require_results(connection: ssh.Connection, earlier: JobRecord) -> None:
    """The run folder a resumed job starts from is there (before anything is sent)."""
    if not has_results(connection, earlier):
        raise HpcboxError(
            f"resume_from: job {earlier.run} left no results in {earlier.run_dir} to resume from",
            "it stopped before it copied anything back: submit it afresh",
        )


def _last_job_on(project: ProjectConfig, target: ssh.Target) -> JobRecord | None:
    """This project's last job submitted through ``target`` (its SIF is the next delta's basis)."""
    return next((r for r in reversed(Ledger(project).all()) if r.host == target.address), None)


def _record(
    profile: ClusterProfile,
    remote: ship.Remote,
    script: JobScript,
    script_name: str,
    job_id: str,
    user: str,
    stamp: datetime,
    payload: ship.Payload,
    image: str,
    trainer_args: tuple[str, ...],
    timings: dict[str, float],
) -> JobRecord:
    log, error_log = log_paths(script, remote.submit_dir, job_id, user)
    resources = asdict(script.resources)
    return JobRecord(
        job_id=job_id,
        cluster=profile.name,
        host=remote.host,
        submitted_at=stamp.isoformat(timespec="seconds"),
        submit_dir=remote.submit_dir,
        script=f"{remote.submit_dir}/scripts/{script_name}",
        log=log,
        run_dir=f"{remote.submit_dir}/{script.inputs.runs_dir}/{job_id}",
        sif=remote.sif,
        sif_sha256=payload.sif_sha256,
        image=image,
        code_revision=script.inputs.code_revision or "unknown",
        code_snapshot=payload.code.digest,
        dataset_sha256=payload.dataset.sha256,
        resources=json.loads(json.dumps(resources, default=str)),
        trainer_args=trainer_args,
        sent=remote.sent,
        bytes_sent=remote.bytes_sent,
        timings_s=timings,
        error_log=error_log,
    )


def log_paths(script: JobScript, submit_dir: str, job_id: str, user: str) -> tuple[str, str | None]:
    """Where job ``job_id`` of ``user`` writes its log and its stderr's own log (None: none), on the
    cluster; an array task's id is `*`."""

    def on_cluster(pattern: str) -> str:
        path = logpaths.expand(pattern, job_id=job_id, job_name=script.resources.job_name, user=user)
        return path if path.startswith("/") else f"{submit_dir}/{path}"

    output, error = script.log_patterns
    return on_cluster(output), on_cluster(error) if error else None


def data_path(
    project: ProjectConfig,
    given: str | None,
    program: ContainerCommand | Steps,
    *,
    say: Callable[[str], None] = print,
) -> Path | None:
    """The dataset, an archive or a directory: ``given`` (relative to here), else `tool.hpcbox.data`
    (relative to the root). None where neither names one: a program of the project's own may need no
    data (its /scratch/data is then empty, said in a line); the example trainer reads its dataset, the
    one `invoke demo` made where there is one."""
    if given:
        return Path(given).expanduser().resolve()
    if project.data:
        return project.root / project.data
    if program == EXAMPLE_TRAINER:
        made = project.state_dir / EXAMPLE_DATASET
        if made.is_file():
            say(f"hpcbox: dataset {made.relative_to(project.root)} (the example trainer's, from invoke demo)")
            return made
        raise HpcboxError(
            "data: no dataset given, and the example trainer reads one",
            'pass --data PATH (one archive, or a directory), or set data = "PATH" in [tool.hpcbox]',
        )
    say("hpcbox: no dataset (--data, or data in [tool.hpcbox]): the job's /scratch/data is empty")
    return None
