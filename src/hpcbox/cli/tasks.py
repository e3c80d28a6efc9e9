"""hpcbox's commands, as an invoke collection: `hpcbox --list` (or `invoke --list` in a project whose
tasks.py imports it) shows them, `hpcbox --help TASK` their options.

A project's own tasks.py needs two lines:

    from hpcbox.tasks import collection
    ns = collection()

Thin by design: parse flags, call the hpcbox package, print. Logic lives in the modules they call.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import invoke
from invoke import Collection, Exit

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.render.options import RESOURCE_OPTIONS, named

# The only single-letter flags of any command: sbatch's own letters (the resource options', from their
# table; --cluster is sbatch's --clusters, -j squeue's job id), each meaning what it means there (the
# long option beside it); every other option is long only.
SHORT_FLAGS = {
    **{option.name: (option.short, option.sbatch) for option in RESOURCE_OPTIONS if option.short},
    "cluster": ("M", "--clusters"),
    "job": ("j", "--job"),  # squeue's
    "output": ("o", "--output"),  # the file a command writes (profile.draft's), as sbatch's -o is
}
STRICT_LOCK_HELP = (
    "refuse to build past a pin Debian no longer serves (default: build with what it serves, labelled "
    "off-lock; HPCBOX_STRICT_LOCK=1 does the same)"
)


class HpcboxTask(invoke.Task):
    """A task whose options are all flags, and whose only short flags are sbatch's (SHORT_FLAGS).

    Invoke makes an option without a default positional (so `hpcbox sbatch --help` would read
    `--help` as the cluster's name) and gives options the first free letter of their name as a short
    flag, which made `-n` the account in one command and the nodes in another: letters mean what
    sbatch says they mean, or nothing.
    """

    def fill_implicit_positionals(self, positional):
        return [] if positional is None else positional

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        opts["names"] = [opts["names"][0], *([SHORT_FLAGS[name][0]] if name in SHORT_FLAGS else [])]
        return opts


task = functools.partial(invoke.task, klass=HpcboxTask)


# The commands whose words after `--` are theirs: the program's arguments, the command a shell runs.
TAKE_WORDS_AFTER_DASHES = ("sbatch", "submit", "shell")


def friendly(fn: Callable[..., Any] | None = None, *, command: str | None = None) -> Any:
    """Turn an HpcboxError into one line on stderr and exit status 1 (tracebacks with HPCBOX_DEBUG=1);
    words after `--` to a command that takes none are one such line, not dropped unsaid. ``command``:
    the name the user types, where it is not the function's (`cluster.shell`, in its namespace)."""
    if fn is None:
        return functools.partial(friendly, command=command)
    name = command or fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            remainder = getattr(args[0], "remainder", "") if args else ""
            if remainder and name not in TAKE_WORDS_AFTER_DASHES:
                raise HpcboxError(
                    f"{name} takes no words after `--` ({remainder})",
                    "only sbatch and submit hand them to the program, and shell runs them",
                )
            return fn(*args, **kwargs)
        except HpcboxError as exc:
            if os.environ.get("HPCBOX_DEBUG"):
                raise
            if _details_add_to(exc):
                print(exc.details, file=sys.stderr)
            print(f"error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"  hint: {exc.hint}", file=sys.stderr)
            sys.exit(1)

    return wrapper


def _needed(command: str, **values: Any) -> None:
    """Refuse in one line an option the command needs that was not given (Invoke passes it as None)."""
    missing = [f"--{name.replace('_', '-')}" for name, value in values.items() if value is None]
    if missing:
        raise HpcboxError(
            f"hpcbox {command} needs {', '.join(missing)}", f"`hpcbox {command} --help` says what it takes"
        )


def _details_add_to(exc: HpcboxError) -> bool:
    """Whether ``exc``'s details (a failed program's command line and its last lines) say more than its
    one line does: a program whose one line of output is the error's own (ssh that cannot resolve a
    host) is said once."""
    said = [line for line in exc.details.splitlines() if line.strip() and not line.startswith("$ ")]
    return any(line.strip() not in exc.message for line in said)


# --- build (issue: foundation and build) ------------------------------------------------------


@task(
    help={
        "flavour": "cuda (default; PyPI CUDA PyTorch) or cpu (Debian's CPU PyTorch; default offline)",
        "offline": "build on a Debian base bootstrapped here instead of pulling from a registry",
        "base": "base image to build on (overrides the flavour's default)",
        "no_cache": "rebuild every layer even if nothing changed",
        "strict_lock": STRICT_LOCK_HELP,
    }
)
@friendly
def build(c, flavour=None, offline=False, base=None, no_cache=False, strict_lock=False):
    """Build the trainer image, tagged by content (no-op when nothing changed)."""
    from hpcbox.api.project import Project

    image = Project(say=print).build(
        flavour, offline=offline, base=base, no_cache=no_cache, strict_lock=strict_lock
    )
    print(image.ref)


@task(
    help={
        "suite": "Debian suite when the project pins no base (default trixie)",
        "mirror": "Debian mirror to bootstrap from (default deb.debian.org)",
        "force": "bootstrap again even if the image exists",
        "strict_lock": STRICT_LOCK_HELP,
    }
)
@friendly
def base(c, suite="trixie", mirror=None, force=False, strict_lock=False):
    """Bootstrap the Debian base image (for hosts with no registry), as docker/lock/base.toml pins it."""
    from hpcbox.api.project import Project

    made = Project(say=print).base(suite, mirror=mirror, force=force, strict_lock=strict_lock)
    print(f"{made.ref} {'bootstrapped' if made.created else 'is up to date'} ({made.id[:19]})")


@task(
    help={
        "base": "image whose Debian mirror decides the apt pins (default: the newly pinned base)",
        "mirror": "Debian mirror to pin the base from (default deb.debian.org)",
        "pip_only": "only the pip locks: the project's dependencies as the package index serves them today",
        "record": "no relocking: build the committed cpu environment and write what it builds to (base id, "
        "content hash, root filesystem, SIF sha256 at the local profile's compression) in digests.toml",
    }
)
@friendly
def lock(c, base=None, mirror=None, pip_only=False, record=False):
    """Refresh the locks: Debian base, Debian versions, pip hashes, registry base digest, SIF helper."""
    from hpcbox.api.project import Project

    project = Project(say=print)
    if record:
        print(project.record_digests())
        return
    changed = project.lock(base=base, mirror=mirror, pip_only=pip_only)
    print("locks changed: " + ", ".join(str(p) for p in changed) if changed else "locks are up to date")


# --- your project ---------------------------------------------------------------------------------


@task(
    iterable=["code"],
    help={
        "script": "the job runs this script of the project: python SCRIPT ARGS (e.g. train.py)",
        "module": "the job runs python -m MODULE ARGS",
        "entry_point": "the job runs this [project.scripts] name's function",
        "args": "its arguments, as one string: --args='--data {data_dir} --out {output_dir}'",
        "code": "a folder or file of your code to ship (repeatable; default: found from the layout)",
        "dependencies": "requirements.txt, pyproject.toml or environment.yml (default: the first found)",
        "dockerfile": "where hpcbox's Dockerfile goes (default docker/Dockerfile)",
        "name": "the image's name (default: the project's)",
        "from_notebook": "a Jupyter notebook of the project whose code becomes the program: NB.py beside "
        "it (what a batch job cannot run kept out as comments)",
        "ci": "also a GitHub Actions workflow and the script it runs: `hpcbox ci` on every push",
    },
)
@friendly
def init(
    c,
    script=None,
    module=None,
    entry_point=None,
    args=None,
    code=None,
    dependencies=None,
    dockerfile="docker/Dockerfile",
    name=None,
    from_notebook=None,
    ci=False,
):
    """Set up hpcbox in this project: docker/, [tool.hpcbox] and tasks.py; never overwrites a file."""
    from hpcbox.project.init import apply, plan_init, program_from_flags

    root = Path.cwd()
    plan = plan_init(
        root,
        program=program_from_flags(module, script, entry_point),
        args=shlex.split(args or ""),
        code=code or (),
        dependencies=dependencies,
        dockerfile=dockerfile,
        name=name,
        from_notebook=from_notebook,
        ci=ci,
    )
    for line in apply(root, plan) or ["nothing to add: hpcbox is set up here"]:
        print(f"hpcbox init: {line}")
    for note in plan.notes:
        print(f"hpcbox init: {note}")


@task
@friendly
def ci(c):
    """Rehearse this project's job as its CI does (`init --ci`), failing unless it completes.

    Build, a mini cluster of the run's own shaped like [tool.hpcbox.ci] cluster, submit, then fail
    unless the job ends COMPLETED with outputs."""
    from hpcbox.testing.ci import rehearse

    passed = rehearse(Path.cwd(), say=say)
    print(
        f"hpcbox ci: passed: {passed.description}; {len(passed.outputs)} output file(s) came back to "
        f"{passed.results}"
    )


# --- sif -----------------------------------------------------------------------------------------


@task(
    help={
        "engine": "for --path reference: auto (default: the host's apptainer if on PATH, else hpcbox's "
        "helper container), host, container; the fast path always runs in the helper",
        "path": "fast (default: mksquashfs reading the image's layers) or reference (apptainer build)",
        "compression": "ALGORITHM[:LEVEL]: gzip, zstd, xz, lz4, lzo, e.g. zstd:3 (default: what --cluster's "
        "profile says its Apptainer reads, else gzip:1, which every Singularity and Apptainer reads)",
        "cluster": "make the SIF this cluster's profile asks for (its compression)",
        "def_only": "only write .hpcbox/definitions/<project>-<flavour>.def, for building on the cluster",
        "def_dir": "with --def-only: the folder to write the .def in",
        "flavour": "convert the image `hpcbox build` last made of this flavour (default: the last one built)",
        "image": "convert this local image instead of the project's (e.g. myimage:tag)",
        "force": "convert again even if the cached SIF is up to date",
        "strict_lock": STRICT_LOCK_HELP,
    }
)
@friendly
def sif(
    c,
    engine="auto",
    path="fast",
    compression=None,
    cluster=None,
    def_only=False,
    def_dir=None,
    flavour=None,
    image=None,
    force=False,
    strict_lock=False,
):
    """Convert the built image to an Apptainer SIF, cached by image content and compression."""
    from hpcbox.api.project import Project
    from hpcbox.sif.compression import parse_compression

    squashfs = parse_compression(compression, "--compression") if compression is not None else None
    project = Project(say=print)
    if def_only:
        print(project.definition(def_dir, flavour=flavour, image=image))
        return
    made = project.sif(
        flavour=flavour, image=image, compression=squashfs, cluster=cluster, engine=engine, path=path,
        force=force, strict_lock=strict_lock,
    )  # fmt: skip
    print(made.path)


@task(
    help={
        "artifact": "a .sif file, or a local image reference",
        "engine": "where Apptainer runs for a SIF: auto (default), host, container",
    },
)
@friendly
def verify(c, artifact, engine="auto"):
    """Rebuild an image or SIF from the commit it records, in a clean checkout: identical or not?"""
    _needed("verify", artifact=artifact)
    from hpcbox.api.project import Project

    verdict = Project(say=say).verify(artifact, engine=engine)
    print("\n".join(verdict.lines()))
    if not verdict.identical:
        raise Exit(code=1)


# --- sbatch / profiles ---------------------------------------------------------------------------


def _words_after_dashes(remainder: str) -> tuple[str, ...]:
    """Words after `--`: from sys.argv when it matches (invoke joins the remainder with spaces)."""

    if "--" in sys.argv:
        after = sys.argv[sys.argv.index("--") + 1 :]
        if " ".join(after) == remainder:
            return tuple(after)
    return tuple(shlex.split(remainder))


RESOURCE_HELP = {
    "cluster": "profile name (render/clusters/, ~/.config/hpcbox/clusters/ or $HPCBOX_CLUSTERS_DIR)",
    **{option.flag: option.help for option in RESOURCE_OPTIONS},
}
VIA_HELP = (
    "local: rehearse the cluster's job on the mini cluster shaped like it (`hpcbox cluster.up --like NAME`)"
)


def job_task(*, after: str, help: dict[str, str], leave_out: tuple[str, ...] = (), **defaults: Any):
    """A task taking the resource flags beside its own options: ``fn(c, ..., **resources)``.

    Invoke reads a task's options from its signature, so the resource flags are put into the one
    ``fn`` declares, right ``after`` its option of that name (the order `--help` lists them in);
    ``defaults`` change a flag's default for this task, ``leave_out`` drops flags.
    """

    def decorate(fn: Callable[..., Any]) -> invoke.Task:
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [
            inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults.get(name, default)
            )
            for name, default in ((option.name, option.unset) for option in RESOURCE_OPTIONS)
            if name not in leave_out
        ]
        split = [p.name for p in own].index(after) + 1
        fn.__signature__ = inspect.Signature([*own[:split], *added, *own[split:]])  # type: ignore[attr-defined]
        flags = {
            name: text for name, text in RESOURCE_HELP.items() if name.replace("-", "_") not in leave_out
        }
        return task(iterable=list(named(tuple)), help={**flags, **help})(friendly(fn))

    return decorate


SWEEP_HELP = "a sweep file (TOML: [grid] of option = [values], [[points]]): an array task per point"


@job_task(
    after="save",
    help={
        "save": "write the script to this file instead of printing it",
        "check": "also run `sbatch --test-only` on the mini cluster (for `local`, or with --via local)",
        "via": VIA_HELP,
        "sif": "SIF path on the cluster (default images/<project>.sif under the submit directory)",
        "sweep": SWEEP_HELP,
    },
)
def sbatch(c, cluster, save=None, sif=None, check=False, via=None, sweep=None, **resources):
    """Render the job script for a cluster: `hpcbox sbatch --cluster=NAME [options] -- trainer args`.

    For an LSF site (a profile with scheduler = "lsf") the script is a bsub one."""
    from hpcbox.api import Site

    site = Site(cluster, via=via, say=say)
    script = site.script(_words_after_dashes(c.remainder), sif=sif, sweep=sweep, **resources)
    if check:
        print(site.check(script), file=sys.stderr)
    if save:
        script.write(Path(save))
        print(f"wrote {save}", file=sys.stderr)
    else:
        print(script.text, end="")


# --- submit and the job's life after it ---------------------------------------------------------


@job_task(
    after="data",
    help={
        "data": "the dataset to stage on node scratch: one archive, or a directory (archived once, "
        "content-addressed; default: tool.hpcbox.data; none: your own program's /scratch/data is empty)",
        "flavour": "image flavour (default: the one `hpcbox build` last made)",
        "offline": "build on the Debian base bootstrapped here (no registry)",
        "host": "login host or ~/.ssh/config alias (default: the profile's)",
        "user": "login user name (default: the profile's, else ~/.ssh/config)",
        "port": "login SSH port",
        "remote_root": "where hpcbox keeps SIFs, data and jobs on the cluster (default ~/hpcbox)",
        "via": VIA_HELP,
        "dry_run": "say what would be uploaded and run, and send nothing",
        "sweep": SWEEP_HELP,
        "resubmit_failed": "JOB: run the points of sweep JOB that did not complete again, and only those, "
        "with its arguments and resource options (each option given now taken instead)",
        "resume_from": "JOB: start from the results and last checkpoint of stopped job JOB (copied on the "
        "cluster), with its arguments unless given after --, and its resource options (each given now "
        "taken instead)",
        "first": "how a race of several clusters or accounts keeps one: start (default: sent to all at "
        "once, the first to start kept) or a time (minutes, or H:M:S): one at a time in the order given, "
        "each given that long to start",
    },
)
def submit(
    c,
    cluster,
    data=None,
    flavour=None,
    offline=False,
    host=None,
    user=None,
    port=None,
    remote_root="hpcbox",
    dry_run=False,
    via=None,
    sweep=None,
    resubmit_failed=None,
    resume_from=None,
    first=None,
    **resources,
):
    """Build, convert, ship what the cluster lacks, sbatch, and record the job: `-- trainer args`.

    Several clusters (`--cluster=a,b`) or accounts (`--account=x,y`) race: the first to start is kept."""
    from hpcbox.api import Site, entrants, listed

    trainer_args = _words_after_dashes(c.remainder)
    clusters, accounts = listed("cluster", cluster), listed("account", resources.get("account"))
    if len(clusters) > 1 or len(accounts) > 1:
        given = {"--sweep": sweep, "--resubmit-failed": resubmit_failed, "--resume-from": resume_from}
        given |= {"--dry-run": dry_run, "--host": host, "--user": user, "--port": port}
        for flag, value in given.items():
            if value:
                raise HpcboxError(f"{flag} does not go with a race", "a race sends one job to each entrant")
        from hpcbox.api import race
        from hpcbox.units import parse_time

        failover_after_s = None if first in (None, "start") else parse_time(first, "first")
        sites = [Site(name, via=via, remote_root=remote_root, say=say) for name in clusters]
        options = {name: value for name, value in resources.items() if name != "account" or len(accounts) < 2}
        stages = {"data": data, "flavour": flavour, "offline": offline, "failover_after_s": failover_after_s}
        raced = race(entrants(sites, accounts), trainer_args, **stages, say=say, **options)
        print(raced.kept.job_id)
        return
    if first is not None:
        raise HpcboxError("--first picks among several clusters or accounts", "name them: --cluster=a,b")
    site = Site(cluster, via=via, host=host, user=user, port=port, remote_root=remote_root, say=say)
    stages = {"data": data, "flavour": flavour, "offline": offline, "dry_run": dry_run}
    if resubmit_failed is None:
        job = site.submit(trainer_args, sweep=sweep, resume_from=resume_from, **stages, **resources)
    elif resume_from is not None:
        raise HpcboxError("--resubmit-failed reruns a sweep's points afresh", "leave out --resume-from")
    elif sweep is not None or trainer_args:
        raise HpcboxError(
            "--resubmit-failed runs the job's own sweep with its own arguments",
            "leave out --sweep and the words after --",
        )
    else:
        job = site.resubmit_failed(resubmit_failed, **stages, **resources)
    if job is not None:
        say(f"hpcbox: sent {job.record.bytes_sent:,} bytes ({', '.join(job.record.sent) or 'nothing new'})")
        say(f"hpcbox: log {job.record.log}")
        print(job.job_id)


def _seconds(field: str, value: str) -> float:
    """A flag's seconds: a number over 0."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise FieldError(field, f"{value!r} is not a number of seconds over 0", f"e.g. --{field}=10")
    return seconds


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _job(job: str | None, cluster: str | None):
    """Job ``job`` of the ledger (default: the last one submitted), reached where it ran."""
    from hpcbox.api import Job

    return Job.find(job, cluster, say=say)


# Invoke has no optional positional arguments: the job is `-j JOB`, and the last job when left out.
JOB_HELP = {
    "job": "job id (default: the last job submitted from here)",
    "cluster": "the job's cluster (e.g. edi, or edi-via-local for its rehearsal)",
}


@task(help={**JOB_HELP, "follow": "a line again each time its state changes, until it ends"})
@friendly
def status(c, job=None, cluster=None, follow=False):
    """Where a job is: state, why it is pending, elapsed time, node, exit code."""
    from hpcbox.api import describe

    found = _job(job, cluster)
    if not follow:
        print("\n".join(found.describe()))
        return
    try:
        if found.record.is_array:  # its tasks' lines now and once they have all ended
            print("\n".join(found.describe()), flush=True)
            found.wait()
            print("\n".join(found.describe()))
        else:
            found.wait(on_change=lambda state: print(describe(state), flush=True))
    except KeyboardInterrupt:
        again = f"hpcbox status -j {found.record.run} --follow"
        say(f"hpcbox: stopped following job {found.record.run}; it goes on (`{again}` follows it again)")
        sys.exit(130)


@task(help={"cluster": "only jobs on this cluster"})
@friendly
def jobs(c, cluster=None):
    """The jobs submitted from this project, with their live states."""
    from hpcbox.api import overview

    lines = overview(cluster)
    print("\n".join(lines) if lines else "no jobs submitted from this project yet")


@task(help={**JOB_HELP, "follow": "keep printing until the job ends"})
@friendly
def logs(c, job=None, cluster=None, follow=False):
    """The job's output (Slurm log), optionally following it until the job ends."""
    found = _job(job, cluster)
    try:
        found.logs(follow=follow, on_line=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        again = f"hpcbox logs -j {found.record.run} --follow"
        say(f"hpcbox: stopped following job {found.record.run}; it goes on (`{again}` follows it again)")
        sys.exit(130)


@task(help=JOB_HELP)
@friendly
def fetch(c, job=None, cluster=None):
    """Copy the job's results, checkpoints, metrics and log to runs/<cluster>/<job>/ (resumable)."""
    print(_job(job, cluster).fetch())


@task(
    help={
        **JOB_HELP,
        "every": "seconds between fetches (default 10)",
        "tensorboard": "serve TensorBoard here over what comes home, live, until Ctrl-C",
    }
)
@friendly
def watch(c, job=None, cluster=None, every=None, tensorboard=False):
    """Bring the job's results home as it runs, its newest figures as lines, until it ends."""
    every_s = None if every is None else _seconds("every", every)
    found = _job(job, cluster)
    with found.tensorboard() if tensorboard else contextlib.nullcontext() as url:
        if url:
            say(f"hpcbox: TensorBoard at {url}")
        try:
            local = found.fetch(follow=True, every_s=every_s, on_line=lambda line: print(line, flush=True))
        except KeyboardInterrupt:
            again = f"hpcbox watch -j {found.record.run}"
            say(f"hpcbox: stopped watching job {found.record.run}; it goes on (`{again}` watches it again)")
            sys.exit(130)
        say(f"hpcbox: results in {local}")
        # How it ended, as status says it: a program of the user's own says nothing of that itself.
        for line in found.describe():
            say(f"hpcbox: {line}")
        if url:
            say(f"hpcbox: the job has ended; TensorBoard goes on at {url} until Ctrl-C")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)


@task(help=JOB_HELP)
@friendly
def report(c, job=None, cluster=None):
    """Was the job efficient: CPU, memory, time, GPUs, throughput, data wait, each with advice; + a PNG."""
    text, shown = _job(job, cluster).report()
    print(text)
    say(f"hpcbox: results in {shown}" if shown.is_dir() else f"hpcbox: plot {shown}")  # a sweep's: its folder


@task(help={"sweep_dir": "the multirun's folder (hydra.sweep.dir), as its launch named it"})
@friendly
def collect(c, sweep_dir):
    """Wait for a Hydra multirun sent with wait=false; bring its outputs home and say what each returned."""
    _needed("collect", sweep_dir=sweep_dir)
    try:
        from hydra_plugins.hydra_hpcbox_launcher.hpcbox_launcher import collect as collect_sweep
    except ModuleNotFoundError as missing:
        needs = f"collecting a Hydra multirun needs Hydra ({missing})"
        raise HpcboxError(needs, "pip install hpcbox[hydra]") from None
    collect_sweep(sweep_dir, say=print)


@task(help=JOB_HELP)
@friendly
def cancel(c, job=None, cluster=None):
    """Stop a job so that it keeps what it wrote: it checkpoints, copies results back, then ends."""
    from hpcbox.api import describe

    print(describe(_job(job, cluster).cancel()))


@task(
    help={
        "cluster": "the cluster whose store to tidy (e.g. edi)",
        "keep": "keep the files of the last N jobs (and of any still queued or running); default: of "
        "every job queued, running or ended in the last 30 days",
        "yes": "delete them (without it, only list them)",
        "via": VIA_HELP,
        "remote_root": "where hpcbox keeps SIFs, data and jobs on the cluster (default ~/hpcbox)",
    },
)
@friendly
def prune(c, cluster, keep=None, yes=False, via=None, remote_root="hpcbox"):
    """The SIFs, datasets and code snapshots on the cluster no recent job uses; deleted with --yes."""
    from hpcbox.api import Site

    pruning = Site(cluster, via=via, remote_root=remote_root, say=say).prune(keep, delete=yes)
    print("\n".join(pruning.lines))
    if yes and pruning.removed:
        size = sum(removed.size for removed in pruning.removed)
        say(f"hpcbox: deleted {len(pruning.removed)} files, {size / 1e6:,.1f} MB")
    elif pruning.plan.removable and not yes:
        what = f"{len(pruning.plan.removable)} files, {pruning.plan.size / 1e6:,.1f} MB"
        say(f"hpcbox: run again with --yes to delete these {what}")


@task(
    help={
        "cluster": "the cluster to look at (e.g. edi); its profile says what to expect",
        "via": VIA_HELP,
        "host": "log in here instead of the profile's host (an alias of ~/.ssh/config too)",
        "port": "SSH port (default: the profile's, or ~/.ssh/config)",
    },
)
@friendly
def doctor(c, cluster, via=None, host=None, port=None):
    """Check the site against its profile: Slurm, partitions, accounts, runtime and storage.

    What the login node says, a line per check, with the profile key to change; exit 1 if a job would
    fail."""
    from hpcbox.api import Site

    checkup = Site(cluster, via=via, host=host, port=port, say=say).doctor()
    print(checkup.table, end="")
    if checkup.failing:
        raise SystemExit(1)


@job_task(
    after="command",
    help={"command": "run this command there instead of an interactive `apptainer shell` (or after `--`)"},
    leave_out=tuple(option.name for option in RESOURCE_OPTIONS if not option.in_shell),
    time="1:00:00",
    job_name="hpcbox-shell",
)
def shell(c, cluster, command=None, **resources):
    """A compute node of the cluster, in Apptainer with the SIF and code of your last job there.

    A shell, or `--command` (or the words after `--`) run there."""
    from hpcbox.api import Site

    words = _words_after_dashes(c.remainder)
    if words and command is not None:
        raise HpcboxError("shell: give the command once", "either --command or the words after `--`")
    Site(cluster, say=say).shell(
        command or (shlex.join(words) if words else None), on_line=print, **resources
    )


@job_task(
    after="job",
    help={
        "attach": "reach the notebook job -j JOB (default: the last one) already running, from another "
        "terminal or after a network drop",
        "job": "with --attach: the notebook's job id",
        "data": "the dataset to stage on node scratch (default: tool.hpcbox.data; none: /scratch/data is "
        "empty)",
        "flavour": "image flavour (default: the one `hpcbox build` last made)",
        "offline": "build on the Debian base bootstrapped here (no registry)",
        "via": VIA_HELP,
        "remote_root": "where hpcbox keeps SIFs, data and jobs on the cluster (default ~/hpcbox)",
    },
    leave_out=("array", "nodes", "ntasks_per_node"),
    time="4:00:00",
    job_name="hpcbox-notebook",
)
def notebook(
    c,
    cluster,
    attach=False,
    job=None,
    data=None,
    flavour=None,
    offline=False,
    via=None,
    remote_root="hpcbox",
    **resources,
):
    """JupyterLab in the project's environment on a compute node, forwarded here.

    A batch job; prints its URL. Ctrl-C ends the job (what it wrote goes to its run folder)."""
    from hpcbox.api import Site

    site = Site(cluster, via=via, remote_root=remote_root, say=say)
    if attach:
        notebook_job = _job(job, cluster) if job else site.last_notebook()
        notebook_job.attach_notebook()
        return
    if job is not None:
        raise FieldError(
            "job", "-j names the notebook to reach with --attach", "add --attach, or leave out -j"
        )
    site.notebook(data=data, flavour=flavour, offline=offline, **resources)


# --- cluster (the mini Slurm-in-Docker cluster) ----------------------------------------------------


def _yes_no(field: str, value: str | None) -> bool | None:
    """A yes/no flag's value; None where it was not given."""
    if value is None:
        return None
    answer = {"yes": True, "no": False}.get(str(value).lower())
    if answer is None:
        raise FieldError(field, f"{value!r} is neither yes nor no", f"--{field}=yes or --{field}=no")
    return answer


def _cluster_tasks() -> Collection:
    """The `cluster.*` tasks, kept in their own namespace (defined here so they stay off the top level)."""
    from hpcbox.minicluster.spec import DEFAULT_NAME, DEFAULT_PORT

    def _state(name: str) -> Path:
        """The user's state root, where every project finds cluster ``name``'s keys (once this
        checkout's, kept there by an older hpcbox, have moved to it). A cluster is the user's, so these
        commands need no project; only a checkout can hold old keys."""
        from hpcbox import minicluster
        from hpcbox.files import project_root
        from hpcbox.minicluster.spec import check_name

        check_name(name)  # before it names a folder
        root = project_root()
        return minicluster.shared_state(name, root / ".hpcbox" if root else None, say=print)

    def _find(name: str):
        from hpcbox import minicluster
        from hpcbox.minicluster.spec import cluster_command, state_dir

        root = _state(name)
        found = minicluster.find(name, root)
        if found is None:
            # A misspelt name is told so before a cluster of that name is offered.
            known = (
                sorted(folder.name for folder in root.iterdir() if folder.is_dir()) if root.is_dir() else []
            )
            close = difflib.get_close_matches(name, known, n=1)
            raise HpcboxError(
                f"no cluster named {name} is up (its keys would be in {state_dir(root, name)})",
                (f"did you mean {close[0]}? " if close else "")
                + f"start it: `{cluster_command('up', name)}`",
            )
        return found

    @task(
        help={
            "nodes": "compute nodes (default 2, or one per GPU layout where --like's partitions have more)",
            "name": "cluster name",
            "port": "login SSH port",
            "like": "shape it like this cluster profile (partitions, GPU types, accounts, scratch): a "
            "rehearsal of that site for `hpcbox submit --cluster NAME --via local` (default: local)",
            "force": "replace a cluster of other settings even while Slurm has unfinished jobs on it or it "
            "holds results never fetched (they are lost)",
            "slurm": "the Slurm version every node runs: 22.05, 24.11 or 26.05 (default: the nearest to the "
            "version --like's profile names, else 24.11)",
            "runtime": "the container command on the compute nodes: apptainer (with its singularity alias) "
            "or singularity alone (default: the one --like's profile names)",
            "fuse": "yes or no: whether Apptainer on the compute nodes can mount a SIF (FUSE for users); "
            "without, jobs unpack it (default: --like's profile, else yes). A running cluster changes "
            "runtime and FUSE in place",
            "squashfuse": "yes or no: squashfuse on the nodes, with which Apptainer mounts a SIF "
            "(default yes)",
            "zstd": "yes or no: whether the nodes' squashfuse reads zstd, as older builds do not "
            "(default yes)",
        }
    )
    @friendly(command="cluster.up")
    def up(
        c,
        nodes=None,
        name=DEFAULT_NAME,
        port=DEFAULT_PORT,
        like="local",
        force=False,
        slurm=None,
        runtime=None,
        fuse=None,
        squashfuse=None,
        zstd=None,
    ):
        """Start the mini Slurm cluster (idempotent, from any project) and wait until it is up.

        Shaped like a profile (--like); a stopped one is started again, its jobs kept; one of other
        settings is replaced (refused while it runs jobs or holds results never fetched)."""
        from hpcbox import minicluster
        from hpcbox.api import up_mini_cluster

        version = minicluster.slurm_like(like, slurm, say=print)
        spec = minicluster.spec_like(
            like,
            name=name,
            nodes=int(nodes) if nodes is not None else None,
            port=int(port),
            slurm=version,
            runtime=runtime,
            fuse=_yes_no("fuse", fuse),
            squashfuse=_yes_no("squashfuse", squashfuse),
            zstd=_yes_no("zstd", zstd),
        )
        cluster = up_mini_cluster(spec, _state(name), force=force, say=print)
        print(minicluster.status(cluster), end="")
        login = ["ssh", "-i", str(cluster.key_path), "-p", str(cluster.login_port)]
        login += ["-o", f"UserKnownHostsFile={cluster.known_hosts}", f"{cluster.user}@127.0.0.1"]
        print(f"login: {shlex.join(login)}")

    @task(help={"name": "cluster name"})
    @friendly(command="cluster.status")
    def status(c, name=DEFAULT_NAME):
        """Show the cluster's nodes (sinfo) and jobs (squeue)."""
        from hpcbox import minicluster

        print(minicluster.status(_find(name)), end="")

    @task(
        help={
            "name": "cluster name",
            "force": "remove it even while Slurm has unfinished jobs on it or it holds results never fetched",
        }
    )
    @friendly(command="cluster.down")
    def down(c, name=DEFAULT_NAME, force=False):
        """Remove the cluster: its containers, network, volumes and keys.

        Refused while it has unfinished jobs or results never fetched, unless --force."""
        from hpcbox.api import remove_mini_cluster

        removed = remove_mini_cluster(name, _state(name), force=force, say=print)
        print(
            f"removed {len(removed.containers)} containers, {len(removed.networks)} network(s), "
            f"{len(removed.volumes)} volume(s) of {name}"
        )

    @task(help={"name": "cluster name"})
    @friendly(command="cluster.shell")
    def shell(c, name=DEFAULT_NAME):
        """Open a shell on the login node as the cluster user, over SSH."""

        from hpcbox.tools import ssh

        c.run(shlex.join(ssh.ssh_argv(_find(name).ssh_target(), tty=True)), pty=True, warn=True)

    return Collection("cluster", up=up, status=status, down=down, shell=shell)


def _profile_tasks() -> Collection:
    """The `profile.*` tasks: cluster profiles, from the site itself."""

    @task(
        help={
            "host": "the site's login node (an alias of ~/.ssh/config too)",
            "port": "its SSH port (default: ~/.ssh/config, else 22)",
            "user": "your user there (default: ~/.ssh/config, else yours here)",
            "output": "the profile file to write, NAME.toml (NAME becomes --cluster; never overwritten)",
            "probe_job": "run a one-minute job on the default partition for what only a compute node "
            "tells: node scratch, the runtime there, internet access",
            "partitions": "only these partitions, comma-separated (default: those with nodes, open to you)",
            "via": "draft the mini cluster brought up here instead of --host: --via local",
        },
    )
    @friendly(command="profile.draft")
    def draft(c, output, host=None, port=None, user=None, probe_job=False, partitions="", via=None):
        """Write a cluster profile from what the site reports.

        Partitions, limits, GPUs, accounts, QOS, runtime; what it cannot tell is marked unknown or
        assumed."""
        from hpcbox.api import CONVENTIONS, draft_profile

        named = tuple(name.strip() for name in partitions.split(",") if name.strip())
        made = draft_profile(
            Path(output),
            host=host,
            port=port,
            user=user,
            via=via,
            probe_job=probe_job,
            partitions=named,
            say=say,
        )
        print(f"wrote {output}: partitions {', '.join(made.partitions)}")
        if made.left_out:
            print(f"left out, having no nodes: {', '.join(made.left_out)}")
        if made.closed:
            print(f"left out, their access lists may keep you out (see {output}): {', '.join(made.closed)}")
        if made.assumed:
            print(f"assumed (a generic value, check it at the site): {', '.join(made.assumed)}")
        print(f"unknown (neither checked nor rendered): {', '.join(made.unknown)}")
        print("site conventions at hpcbox's defaults (no Slurm reports them): " + ", ".join(CONVENTIONS))

    return Collection("profile", draft=draft)


def collection() -> Collection:
    """Every hpcbox task, `cluster.*` and `profile.*` in their own namespaces: a project's tasks.py
    names it `ns`."""
    tasks = Collection.from_module(sys.modules[__name__])
    tasks.add_collection(_cluster_tasks())
    tasks.add_collection(_profile_tasks())
    return tasks
