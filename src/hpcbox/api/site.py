"""`Site`: a cluster resolved once (its profile, how to reach its login node, the project whose jobs go
there), and what a user does with it: render a job script, submit, list jobs, ask the doctor, prune,
open a shell or a notebook."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.render.options import RESOURCE_OPTIONS

if TYPE_CHECKING:
    from hpcbox.api.job import Job
    from hpcbox.jobs.connect import Place
    from hpcbox.jobs.watch import Watch
    from hpcbox.ledger import JobRecord
    from hpcbox.minicluster.cluster import Cluster
    from hpcbox.minicluster.lifecycle import Removed
    from hpcbox.minicluster.spec import ClusterSpec
    from hpcbox.project.command import ContainerCommand, Steps
    from hpcbox.project.config import ProjectConfig
    from hpcbox.render.profiles import ClusterProfile
    from hpcbox.render.resources import Resources
    from hpcbox.render.sbatch import JobScript
    from hpcbox.render.sweep import Sweep
    from hpcbox.store.prune import Plan, Removable
    from hpcbox.store.ship import Payload
    from hpcbox.tools.slurm import Looked
    from hpcbox.tools.ssh import Connection, Target, Transport

Say = Callable[[str], None]

# The resource options a job takes, by the names of their one table (render/options.py).
RESOURCE_NAMES = tuple(option.name for option in RESOURCE_OPTIONS)
SHELL_RESOURCE_NAMES = tuple(option.name for option in RESOURCE_OPTIONS if option.in_shell)
NOTEBOOK_RESOURCE_NAMES = tuple(
    name for name in RESOURCE_NAMES if name not in ("array", "nodes", "ntasks_per_node")
)
# What a shell or a notebook asks for unless told otherwise: an hour at the prompt, an afternoon's notebook.
SHELL_DEFAULTS = {"time": "1:00:00", "job_name": "hpcbox-shell"}
NOTEBOOK_DEFAULTS = {"time": "4:00:00", "job_name": "hpcbox-notebook"}


def to_stderr(line: str) -> None:
    """Progress lines go to stderr: a command's stdout is its data (a job id, a script, a table)."""
    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Checkup:
    """`Site.doctor`'s answer: the table (a line per check, with the profile key to change) and whether
    a job would fail there."""

    table: str
    failing: bool


@dataclasses.dataclass(frozen=True)
class Prepared:
    """`Site.prepare`'s answer: what a submit sends (the SIF, in the compression ``payload`` names; the
    code; the dataset) and the environment image it was converted from, for submits to any site that
    reads that compression to send as they are, none of them checking it again."""

    payload: Payload
    image: str


@dataclasses.dataclass(frozen=True)
class Pruning:
    """`Site.prune`'s answer: what no kept job uses (``plan``, ``lines`` to show it), and what was deleted
    (nothing unless asked to delete)."""

    plan: Plan
    lines: tuple[str, ...]
    removed: tuple[Removable, ...]


def given(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a caller set: an option left at its unset value (None, False, empty) asks for nothing."""
    return {
        name: value for name, value in options.items() if value not in (None, [], ()) and value is not False
    }


def _as_flags(options: Mapping[str, Any]) -> str:
    """Resource options as the command line gives them: `--time=5 --cleanenv --extra=--exclusive`."""
    words: list[str] = []
    for name, value in options.items():
        flag = f"--{name.replace('_', '-')}"
        if value is True:
            words.append(flag)
        else:
            words += [f"{flag}={item}" for item in (value if isinstance(value, list | tuple) else [value])]
    return shlex.join(words)


def _refuse_other_settings(
    earlier: JobRecord, args: Sequence[str], program: ContainerCommand | Steps
) -> None:
    """A resumed job of the example trainer given arguments its checkpoint was not written with is
    refused here, before anything is built or sent, not by the trainer on the node."""
    from hpcbox.project.command import example_trainer_resume_conflicts, runs_example_trainer

    if not runs_example_trainer(program):
        return
    conflicts = example_trainer_resume_conflicts(earlier.trainer_args, tuple(args))
    if conflicts:
        raise FieldError(
            "resume_from",
            f"job {earlier.run}'s checkpoints were written with other settings: {'; '.join(conflicts)}",
            "leave out the words after -- to resume with its own, or change only other settings",
        )


def _refuse_what_the_trainer_refuses(args: Sequence[str], program: ContainerCommand | Steps) -> None:
    """Words after `--` the example trainer would refuse (`--lr abc`, `--epoch 3 4`) are refused here,
    before anything is built or sent, not by the trainer after the job's wait in the queue."""
    from hpcbox.project.command import example_trainer_args_problem, runs_example_trainer

    if runs_example_trainer(program) and (problem := example_trainer_args_problem(args)):
        raise FieldError(
            "arguments",
            problem,
            "`PYTHONPATH=src python3 -m hpctrain train --help` lists its options and their values",
        )


def check_option_names(options: Mapping[str, Any], allowed: Sequence[str] = RESOURCE_NAMES) -> None:
    """A resource option not in ``allowed`` (the table's names) is a typo: refused with the valid ones."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise FieldError(
            unknown[0], f"no such resource option (a typo? allowed: {', '.join(sorted(allowed))})"
        )


class Site:
    """A cluster, resolved once: ``name``'s profile (render/clusters/, ~/.config/hpcbox/clusters/ or
    $HPCBOX_CLUSTERS_DIR; or a profile already loaded), the login node to reach and the project whose
    jobs go there.

    ``via="local"`` rehearses the site's jobs on the mini cluster shaped like it (`hpcbox cluster.up
    --like NAME`); ``host``, ``user`` and ``port`` override the profile's login (~/.ssh/config fills the
    rest); ``login``: the login node reached exactly so (host, port, user, and the only key offered and
    host keys trusted, e.g. a CI runner's deploy key), instead of the profile's or the mini cluster's.
    ``mini_cluster``: the name of the mini cluster that `local` and a rehearsal run on (default:
    HPCBOX_MINICLUSTER's, else hpcbox-local). ``remote_root``: where hpcbox keeps SIFs, data and jobs on
    the cluster, under the login's home. ``cache``: where built SIFs (`sif/`) and dataset archives
    (`data/`) are kept here (default: $HPCBOX_CACHE, else the project's .hpcbox).
    ``project``: the project folder (default: the one around the current directory). ``say`` hears the
    progress lines (default: stderr), ``on_line`` the image build's and the SIF conversion's own output
    (default: shown). ``transport``: what opens its connections (default: the SSH master the user's
    commands share; `hpcbox.testing.MockTransport`, a login node in memory for unit tests).

    Resource options are keyword arguments named as in the option table (``time``, ``mem``, ``gpus``,
    ``gpu_type``, ``partition``, ...), over the project's `[tool.hpcbox.resources]`; a misspelt one is
    refused with the valid names listed.
    """

    def __init__(
        self,
        name: str | ClusterProfile,
        *,
        via: str | None = None,
        host: str | None = None,
        user: str | None = None,
        port: int | str | None = None,
        login: Target | None = None,
        mini_cluster: str | None = None,
        remote_root: str | None = None,
        cache: str | Path | None = None,
        project: ProjectConfig | str | Path | None = None,
        say: Say = to_stderr,
        on_line: Say | None = None,
        transport: Transport | None = None,
    ) -> None:
        from hpcbox.jobs.connect import Place
        from hpcbox.render.profiles import ClusterProfile, load_profile
        from hpcbox.store.ship import DEFAULT_REMOTE_ROOT
        from hpcbox.tools import ssh

        self.profile = name if isinstance(name, ClusterProfile) else load_profile(name)
        self.place: Place = Place(via=via, host=host, user=user, port=_port(port))
        self.login = login
        self.mini_cluster = mini_cluster
        self.remote_root = remote_root or DEFAULT_REMOTE_ROOT
        self.cache = None if cache is None else Path(cache)
        self.project: ProjectConfig = project_of(project)
        self.say = say
        self.on_line = on_line
        self.transport: Transport = transport or ssh.Connection

    def __repr__(self) -> str:
        return f"Site({self.where!r})"

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def where(self) -> str:
        """The site as the ledger names it: `edi`, or `edi-via-local` for its rehearsal."""
        return self.name if self.place.via is None else f"{self.name}-via-{self.place.via}"

    @property
    def compression(self) -> str:
        """The SIF compression this site reads (its profile's), as a `Prepared` payload names it."""
        return str(self.profile.apptainer.compression)

    @functools.cached_property
    def target(self) -> Target:
        """The login node to reach (the mini cluster, which must be up, for `local` or a rehearsal)."""
        from hpcbox.jobs.connect import connection_target

        if self.login is not None:
            return self.login
        return connection_target(
            self.profile, self.project, **dataclasses.asdict(self.place), mini_cluster=self.mini_cluster
        )

    def connect(self) -> Connection:
        """A connection to its login node for a `with` block: the SSH master the user's commands share
        (`tools.ssh.Connection`), or the ``transport``'s (`hpcbox.testing.MockTransport`)."""
        return self.transport(self.target)

    @functools.cached_property
    def mini(self) -> Cluster | None:
        """The mini cluster its jobs run on (`local`, or a rehearsal), which must be up; None for a
        site's login node, or a login given (``login=``)."""
        from hpcbox.jobs.connect import on_mini_cluster, running_mini_cluster

        if self.login is not None or not on_mini_cluster(self.profile, self.place.via, self.place.host):
            return None
        return running_mini_cluster(self.project.state_dir, like=self.profile.name, name=self.mini_cluster)

    @functools.cached_property
    def watch(self) -> Watch:
        """What this process waits on at this site, looked at together (`jobs.watch.Watch`): one squeue
        for all its jobs a look, less often the longer the wait; shared by every `Site` of the same
        login node and project in the process."""
        from hpcbox.jobs.watch import watch_at

        return watch_at((self.target, self.project.root), self._look, self._peek)

    def _look(self, records: Sequence[JobRecord]) -> Looked:
        """One look at ``records`` (jobs of this site); one whose mini cluster has gone since is said so,
        not asked about (its id may name another job there now)."""
        from hpcbox import jobs

        said: Looked = {}
        here = []
        for record in records:
            try:
                jobs.check_reachable(record, self.project)
            except HpcboxError as gone:
                said[record.job_id] = gone
            else:
                here.append(record)
        if here:
            with self.connect() as connection:
                said.update(jobs.look(connection, here))
        return said

    def _peek(self, records: Sequence[JobRecord]) -> set[str]:
        """Which of ``records`` (jobs of this site) and their tasks keep an exit status in their run
        folders (`jobs.exits_kept`): between looks, no call to Slurm."""
        from hpcbox import jobs

        with self.connect() as connection:
            return jobs.exits_kept(connection, records)

    def at(self, place: Place, *, mini_cluster: str | None = None) -> Site:
        """This site reached another way (where a job ran): the same profile, project and login given
        (``login=``: its key and host keys, which ~/.ssh/config does not know); ``mini_cluster``: the
        mini cluster it ran on, where that is not this site's."""
        mini_cluster = mini_cluster or self.mini_cluster
        if place == self.place and mini_cluster == self.mini_cluster:
            return self
        return Site(
            self.profile, **dataclasses.asdict(place), login=self.login, mini_cluster=mini_cluster,
            remote_root=self.remote_root, cache=self.cache, project=self.project, say=self.say,
            on_line=self.on_line, transport=self.transport,
        )  # fmt: skip

    def _where_ran(self, record: JobRecord, *, agreeing: bool = True) -> Site:
        """This site reached where ``record``'s job ran: the login node it was sent to, or the mini
        cluster it ran on (of several up, the one the record names, whichever this site names); with
        ``agreeing``, a login or rehearsal of this site's that says otherwise is refused in one line."""
        from hpcbox import jobs

        place = jobs.place_of(record, **dataclasses.asdict(self.place)) if agreeing else jobs.place_of(record)
        return self.at(place, mini_cluster=record.mini_cluster)

    # --- the job's request and script ------------------------------------------------------------

    def resources(
        self,
        options: Mapping[str, Any],
        *,
        sweep_tasks: str | None = None,
        command: ContainerCommand | None = None,
        allowed: Sequence[str] = RESOURCE_NAMES,
        warn: bool = True,
    ) -> Resources:
        """The job's request checked against the profile: ``options`` (by the option table's names) over
        SBATCH_ACCOUNT/PARTITION/QOS over the project's defaults for this site. ``sweep_tasks``: the
        array a sweep runs; ``command``: what the job runs, if not the project's program. What the
        profile cannot check is said as a warning (with ``warn``; else the caller says them)."""
        from hpcbox.render import resources

        check_option_names(options, allowed)
        flags = dict(options)  # request_for leaves out what was left off
        if sweep_tasks is not None:
            if flags.get("array"):
                raise FieldError(
                    "array",
                    "--array and the sweep both say which tasks run",
                    "set throttle = N in the sweep file",
                )
            flags["array"] = sweep_tasks
        request = resources.request_for(
            self.name, flags, self.project.root / "pyproject.toml", self.project.name, environ=os.environ
        )
        checked = resources.resolve(self.profile, request, ddp=(command or self.project.run).ddp)
        if warn:
            self._warn(checked)
        return checked

    def _warn(self, checked: Resources) -> None:
        for line in checked.unverified:
            self.say(f"hpcbox: warning: {line}")

    def sweep(self, sweep: Sweep | str | Path | None) -> Sweep | None:
        """A sweep (or a sweep file's path, read and checked: for the example trainer, each key one of
        its options); only a Slurm site runs one."""
        from hpcbox.project.command import EXAMPLE_TRAINER_OPTIONS, runs_example_trainer
        from hpcbox.render.sweep import Sweep, load_sweep

        if sweep is None:
            return None
        if self.profile.lsf:
            raise FieldError("sweep", f"{self.name} uses LSF, whose arrays hpcbox does not run sweeps in yet")
        if isinstance(sweep, Sweep):
            return sweep
        known = runs_example_trainer(self.project.run)
        return load_sweep(
            Path(sweep),
            {flag: rule.problem for flag, rule in EXAMPLE_TRAINER_OPTIONS.items()} if known else None,
        )

    def script(
        self,
        args: Sequence[str] = (),
        *,
        sif: str | None = None,
        sweep: Sweep | str | Path | None = None,
        **options: Any,
    ) -> JobScript:
        """The job script (sbatch's, or bsub's for an LSF site) running the project's program with
        ``args``; ``sif``: the SIF's path on the cluster (default `images/<project>.sif` under the submit
        directory); ``sweep``: an array task per point."""
        from hpcbox.render.bsub import renderer
        from hpcbox.render.sbatch import JobInputs

        points = self.sweep(sweep)
        _refuse_what_the_trainer_refuses(args, self.project.run)
        checked = self.resources(options, sweep_tasks=points.array() if points else None)
        return renderer(self.profile)(
            self.profile,
            checked,
            JobInputs.defaults(self.project.name, sif=sif),
            tuple(args),
            self.project.run,
            **({"sweep": points} if points else {}),
        )

    def check(self, script: JobScript) -> str:
        """`sbatch --test-only` of ``script`` on the mini cluster (`local`, or this site rehearsed
        ``via="local"``): when and where Slurm would start it, or why it would refuse it."""
        from hpcbox.tools import slurm

        if self.profile.lsf:
            raise HpcboxError(
                f"--check: {self.name} uses LSF, which has no `sbatch --test-only`",
                "on the login node, `BSUB_CHK_RESREQ=1 bsub < FILE` checks its resource strings without "
                "submitting",
            )
        if self.name != "local" and self.place.via is None:
            raise HpcboxError(
                f"--check cannot reach cluster {self.name!r}",
                f"rehearse it: `hpcbox cluster.up --like {self.name}`, then add `--via local`; on the site, "
                "run `sbatch --test-only FILE` on the login node",
            )
        target = self.target
        self._rehearse(script.resources)
        answer = slurm.test_only(target, script.text)
        if guess := slurm.test_only_start(answer):
            answer += (
                f"\nhpcbox: Slurm would accept it; {guess} is Slurm's guess of its start from the queue as "
                "it stands now, not a promise"
            )
        return answer

    # --- submit ----------------------------------------------------------------------------------

    def submit(
        self,
        args: Sequence[str] = (),
        *,
        data: str | Path | None = None,
        flavour: str | None = None,
        offline: bool = False,
        sweep: Sweep | str | Path | None = None,
        dry_run: bool = False,
        command: ContainerCommand | None = None,
        resume_from: Job | str | None = None,
        prepared: Prepared | None = None,
        before_upload: Callable[[], None] | None = None,
        **options: Any,
    ) -> Job | None:
        """Build the environment image, convert it to a SIF, ship what the cluster lacks (a changed SIF
        as a delta), sbatch and record the job; each stage is a no-op when nothing changed.

        ``args``: the program's arguments; ``data``: the dataset to stage on node scratch (an archive,
        or a directory archived once; default `tool.hpcbox.data`; "none": no dataset); ``flavour``: the
        image's (default: the one `hpcbox build` last made); ``offline``: build on the Debian base
        bootstrapped here; ``sweep``: an array task per point; ``dry_run``: say what would be sent and
        run, send nothing, and return None; ``command``: what the job runs in the container instead of
        the project's program (`[tool.hpcbox.run]`); ``resume_from``: a stopped job of this site (a
        `Job`, its id or its run's name), whose results and checkpoints the job starts from, copied on
        the cluster (its arguments too, where ``args`` gives none); ``prepared``: what `prepare` made for
        a site of this compression, sent as it is (``data``, ``flavour`` and ``offline`` then say
        nothing: they made it); ``before_upload``: called once before a file too big to go with the
        sbatch is uploaded (a race holds a site's upload there until the sites that lack nothing have
        sent their jobs)."""
        from hpcbox.jobs.connect import require_slurm

        require_slurm(self.profile)
        points = self.sweep(sweep)
        earlier = None
        if resume_from is not None:
            earlier = self._resumable(resume_from, points)
            if not args:
                args = earlier.trainer_args
                self.say(
                    f"hpcbox: resuming job {earlier.run} with its arguments: {shlex.join(args) or '(none)'}"
                )
            else:
                _refuse_other_settings(earlier, args, command or self.project.run)
            options = self._options_of(earlier, options)
        return self._submit(
            tuple(args),
            points,
            points.array() if points else None,
            data,
            flavour,
            offline,
            dry_run,
            None,
            options,
            command=command,
            resume_from=earlier,
            prepared=prepared,
            before_upload=before_upload,
        )

    def prepare(
        self,
        *,
        data: str | Path | None = None,
        flavour: str | None = None,
        offline: bool = False,
        command: ContainerCommand | None = None,
        **options: Any,
    ) -> Prepared:
        """What `submit` makes before it sends anything, made here and now: the environment image, its
        SIF in the compression this site reads, the code and the dataset (each a no-op when made
        before), and the rehearsal (via local) ready; nothing is sent. What it made, for `submit`'s
        ``prepared`` here and at every site that reads the same compression."""
        checked = self.resources(options, command=command, warn=False)
        payload, environment = self._payload(
            checked, data, flavour, offline, program=command or self.project.run
        )
        return Prepared(payload, environment.ref)

    def _resumable(self, job: Job | str, points: Sweep | None) -> JobRecord:
        """The record of ``job``, a job of this site that a new one can start from."""
        from hpcbox import jobs
        from hpcbox.api.job import Job

        if points is not None:
            raise FieldError(
                "resume_from", "a sweep's tasks each start afresh", "leave out --sweep to resume a job"
            )
        earlier = job.record if isinstance(job, Job) else jobs.Ledger(self.project).find(str(job), self.where)
        if earlier.where != self.where:
            where = f"--cluster {earlier.cluster}" + (f" --via {earlier.via}" if earlier.via else "")
            raise FieldError(
                "resume_from",
                f"job {earlier.run} ran on {earlier.where}, not {self.where}",
                f"resume it there: {where}",
            )
        if earlier.is_array:
            raise FieldError(
                "resume_from", f"job {earlier.run} is a sweep", "resume one point's job, not a sweep"
            )
        jobs.check_reachable(earlier, self.project)
        return earlier

    def resubmit_failed(
        self,
        job: Job | str,
        *,
        data: str | Path | None = None,
        flavour: str | None = None,
        offline: bool = False,
        dry_run: bool = False,
        **options: Any,
    ) -> Job | None:
        """Run the points of sweep ``job`` that did not complete again, and only those, with its
        arguments (and ``options`` as resources), where it ran; None when every point completed.
        Which did not: Slurm's word, else (Slurm has forgotten the job) the exit status each point's
        run folder kept on the cluster, else (its mini cluster is gone) in the results fetched here."""
        from hpcbox import jobs
        from hpcbox.api.job import Job

        jobs.require_slurm(self.profile)
        original = job.record if isinstance(job, Job) else jobs.Ledger(self.project).find(job, self.name)
        # The rerun goes where the job ran (a rehearsal stays one): a site reached otherwise is refused.
        site = self._where_ran(original)
        if (gone := jobs.gone(original, self.project)) is None:
            with site.connect() as connection:
                outcomes = jobs.sweep_outcomes(connection, original)
            if outcomes.read_from:
                self.say(f"hpcbox: Slurm no longer knows job {original.run}: {outcomes}")
        elif jobs.fetched(self.project, original):
            outcomes = jobs.fetched_outcomes(self.project, original)
            self.say(f"hpcbox: {gone}: which points failed is read {outcomes}")
        else:
            raise HpcboxError(
                f"{gone}: nothing tells which of its points failed",
                f"`--sweep` with its sweep file runs all {len(original.sweep)} points anew",
            )
        failed = jobs.failed_tasks(original, outcomes.tasks)
        if not failed:
            self.say(f"hpcbox: every task of job {original.job_id} completed: nothing to resubmit")
            return None
        points = jobs.sweep_of(original)
        array = points.array(failed)
        self.say(
            f"hpcbox: {len(failed)} of {len(points.points)} tasks of job {original.job_id} again: {array}"
        )
        options = self._options_of(original, options)
        return site._submit(
            original.trainer_args, points, array, data, flavour, offline, dry_run, original.run, options
        )

    def _options_of(self, earlier: JobRecord, options: Mapping[str, Any]) -> dict[str, Any]:
        """The resource options a job run again from ``earlier`` (its failed points, or resumed) is sent
        with: those ``earlier`` was sent with, each given in ``options`` taken instead; said."""
        now = given(options)
        if earlier.options is None:
            self.say(
                f"hpcbox: job {earlier.run}'s record predates hpcbox keeping a job's resource options: "
                f"only those given now apply ({_as_flags(now) or 'none'})"
            )
            return now
        kept = {name: value for name, value in earlier.options.items() if name not in now}
        if kept:
            said = f"with job {earlier.run}'s resource options {_as_flags(kept)}"
            self.say(f"hpcbox: {said}" + (f", and {_as_flags(now)} given now" if now else ""))
        return {**kept, **now}

    def _submit(
        self,
        args: tuple[str, ...],
        points: Sweep | None,
        array: str | None,
        data: str | Path | None,
        flavour: str | None,
        offline: bool,
        dry_run: bool,
        resubmits: str | None,
        options: Mapping[str, Any],
        *,
        command: ContainerCommand | None = None,
        resume_from: JobRecord | None = None,
        prepared: Prepared | None = None,
        before_upload: Callable[[], None] | None = None,
    ) -> Job | None:
        from hpcbox.api.job import Job

        program = command or self.project.run
        _refuse_what_the_trainer_refuses(args, program)
        checked = self.resources(options, sweep_tasks=array, command=command, warn=False)
        if prepared is not None and prepared.payload.compression != self.compression:
            raise FieldError(
                "prepared",
                f"made with {prepared.payload.compression} SIFs; {self.name} reads {self.compression}",
                f"prepare for {self.name} (or a site of its compression)",
            )
        with self._submitted(
            checked, args, data, flavour, offline, program=program, prepared=prepared, dry_run=dry_run,
            sweep=points, resubmits=resubmits, command=command, resume_from=resume_from,
            before_upload=before_upload, options=given(options),
        ) as (record, _):  # fmt: skip
            return None if record is None else Job(self, record)

    @contextlib.contextmanager
    def _submitted(
        self,
        checked: Resources,
        args: tuple[str, ...],
        data: str | Path | None,
        flavour: str | None,
        offline: bool,
        *,
        program: ContainerCommand,
        prepared: Prepared | None = None,
        stage: Mapping[str, Any] | None = None,
        **submitting: Any,
    ) -> Iterator[tuple[JobRecord | None, Connection]]:
        """The one submit sequence: the login node connected once the input is checked, before anything
        is built (a login that does not answer is said in seconds, not after a build and a conversion),
        what the job needs made (``stage``: prepare_payload's target and on_line) or taken as
        ``prepared``, then sent and sbatched (``submitting``: `jobs.submit`'s options); the job's record
        (None for a dry run) and the connection, open until the block ends."""
        from hpcbox import jobs

        with contextlib.ExitStack() as held:
            opened: list[Connection] = []

            def connect() -> None:
                self._warn(checked)  # after bad input's one line, before any work
                opened.append(held.enter_context(self.connect()))

            if prepared is None:
                payload, environment = self._payload(
                    checked, data, flavour, offline, program=program, before_work=connect, **(stage or {})
                )
                image = environment.ref
            else:
                self._ready(checked)
                connect()
                payload, image = prepared.payload, prepared.image
            record = jobs.submit(
                self.project, self.profile, self.target, checked, args, payload, image=image,
                via=self.place.via, remote_root=self.remote_root, connection=opened[0], mini=self.mini,
                say=self.say, **submitting,
            )  # fmt: skip
            yield record, opened[0]

    def _rehearse(self, checked: Resources) -> None:
        """On the mini cluster, what the job names that the profile cannot know is made there first."""
        from hpcbox import jobs

        via, mini = self.place.via, self.mini_cluster
        jobs.say_rehearsal_slurm(self.profile, self.project, via=via, mini_cluster=mini, say=self.say)
        jobs.rehearse(
            self.profile,
            self.project,
            checked,
            via=via,
            host=self.place.host,
            mini_cluster=mini,
            say=self.say,
        )

    def _ready(self, checked: Resources) -> None:
        """The site reachable as far as can be told here (a rehearsal that is not up is said before
        anything is built) and, via local, its rehearsal made ready for the job."""
        self.target  # noqa: B018
        self._rehearse(checked)

    def _payload(self, checked: Resources, data, flavour, offline, *, program, **stage):
        """The rehearsal made ready (via local), then what goes there: the image (``stage``:
        prepare_payload's target, on_line and before_work), its SIF, the code and the dataset (which
        ``program``, the job's, may do without)."""
        from hpcbox import jobs

        self._ready(checked)
        return jobs.prepare_payload(
            self.project, jobs.data_path(self.project, data, program, say=self.say),
            self.profile.apptainer.compression, flavour=flavour, offline=offline, gpus=checked.gpus,
            cache=self.cache and self.cache / "sif", data_cache=self.cache and self.cache / "data",
            say=self.say, **{"on_line": self.on_line, **stage},
        )  # fmt: skip

    # --- the site's jobs -------------------------------------------------------------------------

    def job(self, job_id: str | None = None) -> Job:
        """Job ``job_id`` submitted from this project to this site (default: the last one)."""
        from hpcbox import jobs
        from hpcbox.api.job import Job

        record = jobs.Ledger(self.project).find(job_id, self.where)
        return Job(self._where_ran(record), record)

    def jobs(self) -> list[Job]:
        """The jobs submitted from this project to this site, oldest first."""
        from hpcbox import jobs
        from hpcbox.api.job import Job

        return [
            Job(self._where_ran(record, agreeing=False), record)
            for record in jobs.Ledger(self.project).all()
            if record.where == self.where
        ]

    def shell(self, command: str | None = None, *, on_line: Say = print, **options: Any) -> None:
        """A compute node in Apptainer with the SIF and code of the last job here (at this site or its
        rehearsal, where that job ran): `apptainer shell` on the user's terminal, or ``command`` with
        its output to ``on_line``."""
        from hpcbox import jobs

        jobs.require_slurm(self.profile)
        record = jobs.Ledger(self.project).find(None, self.where)
        site = self._where_ran(record)
        checked = site.resources({**SHELL_DEFAULTS, **given(options)}, allowed=SHELL_RESOURCE_NAMES)
        site._rehearse(checked)
        with site.connect() as connection:
            jobs.shell(connection, site.profile, checked, record, command, on_line=on_line)

    def notebook(
        self,
        *,
        data: str | Path | None = None,
        flavour: str | None = None,
        offline: bool = False,
        show: Say = print,
        **options: Any,
    ) -> Job:
        """JupyterLab from the project's environment as a batch job on a compute node, forwarded to a
        local port, its URL to ``show``; until Ctrl-C (which ends the job: what it wrote goes to its run
        folder) or SIGHUP/SIGTERM (which leave it running: `Job.attach_notebook`)."""
        from hpcbox import jobs
        from hpcbox.api.job import Job
        from hpcbox.build.image import NOTEBOOK as NOTEBOOK_TARGET
        from hpcbox.jobs import notebook as notebooks
        from hpcbox.project.command import NOTEBOOK

        jobs.require_slurm(self.profile)
        checked = self.resources(
            {**NOTEBOOK_DEFAULTS, **given(options)},
            command=NOTEBOOK,
            allowed=NOTEBOOK_RESOURCE_NAMES,
            warn=False,  # said once the input is checked, as for a submit
        )
        notebooks.check_resources(checked)
        stage = {"target": NOTEBOOK_TARGET, "on_line": self.say}
        with self._submitted(
            checked, (), data, flavour, offline, program=NOTEBOOK, stage=stage, command=NOTEBOOK
        ) as (record, connection):
            assert record is not None  # not a dry run
            self.say(f"hpcbox: notebook job {record.job_id} submitted; log {record.log}")
            notebooks.serve(connection, self.profile, record, sent_here=True, say=self.say, show=show)
        return Job(self, record)

    def last_notebook(self) -> Job:
        """The last notebook job started here from this project."""
        from hpcbox.jobs import notebook as notebooks
        from hpcbox.jobs.connect import require_slurm

        require_slurm(self.profile)
        return self.job(notebooks.last_notebook(self.project, self.where))

    # --- the site itself -------------------------------------------------------------------------

    def doctor(self) -> Checkup:
        """What the login node says of Slurm, partitions, accounts, the container runtime and storage,
        against the profile."""
        from hpcbox.jobs import require_slurm
        from hpcbox.survey import doctor

        require_slurm(self.profile)
        table, failing = doctor.check(self.target, self.profile, say=self.say)
        return Checkup(table, failing)

    def prune(self, keep: int | None = None, *, delete: bool = False) -> Pruning:
        """The SIFs, datasets and code snapshots in the site's store that no kept job uses: those of the
        last ``keep`` jobs and any still queued or running are kept (default: of every job queued,
        running or ended in the last 30 days); deleted only with ``delete``."""
        from hpcbox import jobs
        from hpcbox.store import prune as pruning

        if keep is not None and not str(keep).isdigit():
            raise FieldError(
                "keep", f"{keep!r} is not a number of jobs", "give how many to keep, e.g. --keep 3"
            )
        keep = int(keep) if keep is not None else None
        jobs.require_slurm(self.profile)
        records = [record for record in jobs.Ledger(self.project).all() if record.host == self.target.address]
        with self.connect() as connection:
            plan = pruning.plan(connection, self.project.name, records, root=self.remote_root, keep=keep)
            removed = pruning.apply(connection, plan, say=self.say) if delete else ()
        return Pruning(plan, tuple(pruning.describe(plan, keep=keep)), removed)


def overview(cluster: str | None = None, *, project: ProjectConfig | str | Path | None = None) -> list[str]:
    """A line per job submitted from ``project`` (on ``cluster`` where given), with its live state."""
    from hpcbox import jobs

    return jobs.overview(project_of(project), cluster)


def up_mini_cluster(spec: ClusterSpec, state_root: Path, *, force: bool = False, say: Say = print) -> Cluster:
    """Mini cluster ``spec`` up and ready (`minicluster.up`): the one there is if it matches, its stopped
    containers started again with its jobs and results; one of other settings replaced only while
    Slurm holds no unfinished job there and no results never fetched (as `remove_mini_cluster`
    refuses), or with ``force``, which says what goes with it."""
    from hpcbox import jobs, minicluster

    def refuse_unfetched(current: Cluster, why: str) -> None:
        jobs.refuse_unfetched(current, "replace", why, force=force, say=say)

    return minicluster.up(spec, state_root, force=force, on_line=say, before_replacing=refuse_unfetched)


def remove_mini_cluster(name: str, state_root: Path, *, force: bool = False, say: Say = print) -> Removed:
    """Remove mini cluster ``name`` (its containers, network, volumes and keys), refused while Slurm
    holds a job there that has not ended or while it holds results never fetched (the jobs named, by
    project); with ``force``, what goes with it is said and it goes."""
    from hpcbox import jobs, minicluster

    minicluster.refuse_unfinished(name, "remove", force=force, say=say)
    cluster = minicluster.find(name, state_root)
    if cluster is not None:
        jobs.refuse_unfetched(cluster, force=force, say=say)
    return minicluster.down(name, state_root, on_line=say)


def project_of(project: ProjectConfig | str | Path | None) -> ProjectConfig:
    """The project given, or the one in folder ``project`` (default: around the current directory)."""
    from hpcbox.project.config import ProjectConfig, load_project

    return project if isinstance(project, ProjectConfig) else load_project(Path(project) if project else None)


def _port(port: int | str | None) -> int | None:
    if port is None:
        return None
    if not str(port).isdigit() or not 0 < int(port) < 65536:
        raise FieldError(
            "port", f"{port!r} is not a TCP port", "give a number from 1 to 65535, e.g. --port 2222"
        )
    return int(port)


def draft_profile(
    output: Path,
    *,
    host: str | None = None,
    port: int | str | None = None,
    user: str | None = None,
    via: str | None = None,
    probe_job: bool = False,
    partitions: Sequence[str] = (),
    say: Say = to_stderr,
):
    """A cluster profile written to ``output`` (NAME.toml; never overwritten) from what the site at
    ``host`` (or the mini cluster, ``via="local"``) reports: partitions, limits, GPUs, accounts, QOS,
    runtime; what it cannot tell is marked unknown or assumed. ``probe_job``: a one-minute job for what
    only a compute node tells; ``partitions``: only these (default: those with nodes, open to you)."""
    from hpcbox.files import project_root
    from hpcbox.jobs import running_mini_cluster
    from hpcbox.survey import draft
    from hpcbox.tools import ssh

    if (host is None) == (via is None):
        raise FieldError(
            "host",
            "give one of --host (the site's login node) and --via local",
            "e.g. --host login.example.edu",
        )
    if via is not None:
        if via != "local":
            raise FieldError("via", f"{via!r} is not a place hpcbox drafts from", "use --via local")
        root = project_root()
        target = running_mini_cluster(root / ".hpcbox" if root else None).ssh_target()
    else:
        target = ssh.Target(host, _port(port), user)
    return draft.draft(target, Path(output), probe_job=probe_job, partitions=tuple(partitions), say=say)
