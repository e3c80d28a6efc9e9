"""The mini cluster a test session brings up for the project under test, and the handle its tests hold.

Named uniquely per session, so that two projects' CI runs on one machine (or two workers of one run)
never share a cluster, and never the user's own `hpcbox-local`. Its keys live in the session's folder,
and so do the ledger and fetched results of its jobs: a fresh cluster counts job ids from 1 again, and
its records must not overwrite those of the user's own `local` jobs in `.hpcbox/jobs` and `runs/`.

Nothing here loads the Docker SDK at import: the pytest plugin imports this module only when a test
asks for the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.tools.proc import signals_held

if TYPE_CHECKING:
    from hpcbox.api import Job, Site
    from hpcbox.minicluster import Cluster, Removed
    from hpcbox.tools.proc import Completed

Say = Callable[[str], None]

DEFAULT_PROFILE = "local"
STATE_VARIABLE = "HPCBOX_MINICLUSTER_STATE"  # where hpcbox finds mini clusters' keys (minicluster/state.py)
NAME_PREFIX = "hpcbox-pytest-"  # then 8 hex digits: a valid cluster name, never the user's hpcbox-local
# Under the user's private folder: one file per session cluster, flock'ed by the process whose it is.
OWNERS = "pytest-clusters"


@dataclass(frozen=True)
class ClusterSettings:
    """What the session's cluster rehearses: the Slurm of profile ``profile`` (`local`, or a site's, whose
    partitions, GPU types and account rules it takes), running Slurm ``slurm`` (None: the version the
    mini cluster has nearest to the profile's `[slurm] version`, else its default)."""

    profile: str = DEFAULT_PROFILE
    slurm: str | None = None

    def checked(self, *, profile_field: str, slurm_field: str) -> ClusterSettings:
        """These settings, once both are known good, before anything is built or started; an error names
        the option at fault (``profile_field``, ``slurm_field``: as the user set it)."""
        from hpcbox.minicluster import versions
        from hpcbox.render.profiles import load_profile

        if self.slurm is not None:
            versions.check(self.slurm, slurm_field)
        try:
            load_profile(self.profile)
        except FieldError as exc:
            raise FieldError(profile_field, exc.message.split(": ", 1)[1], exc.hint) from exc
        return self


@dataclass(frozen=True)
class SessionCluster:
    """The session's mini cluster, as the project's tests use it: ``site`` submits the project's job
    there (an `hpcbox.Site`: `submit`, `job`, `jobs`, `check`, `shell`...), and the job it returns
    waits, shows its logs and fetches its results (`hpcbox.Job`). ``name`` prefixes every container,
    network and volume of it; ``folder`` holds its keys (removed with it), and its jobs' ledger and
    fetched results (kept with the session's temporary files)."""

    name: str
    site: Site
    cluster: Cluster
    folder: Path

    @property
    def profile(self) -> str:
        """The profile the cluster is shaped like (`local`, or the site rehearsed)."""
        return self.site.name

    @property
    def slurm(self) -> str:
        """The Slurm version every node runs (22.05, 24.11...)."""
        return self.cluster.spec.slurm

    def submit(self, args: Sequence[str] = (), **options: Any) -> Job:
        """The project's job with ``args``, submitted here: `Site.submit`'s options (``data``,
        ``offline``, ``sweep``, ``command``, and resources by the option table's names: ``time``,
        ``mem``, ``gpus``...). For a dry run, use ``site.submit`` (it returns no job)."""
        if options.get("dry_run"):
            raise HpcboxError(
                "submit: a dry run submits no job", "call hpcbox_cluster.site.submit(..., dry_run=True)"
            )
        job = self.site.submit(args, **options)
        assert job is not None  # not a dry run: a job was submitted
        return job

    def job(self, job_id: str | None = None) -> Job:
        """Job ``job_id`` submitted in this session (default: the last one)."""
        return self.site.job(job_id)

    def jobs(self) -> list[Job]:
        """The jobs submitted in this session, oldest first."""
        return self.site.jobs()

    def run(self, command: str | Sequence[str], *, check: bool = True) -> Completed:
        """``command`` on the login node as the cluster's user, over SSH (`.stdout`, `.stderr`,
        `.returncode`); with ``check``, a failure raises HpcboxError with its output."""
        return self.cluster.ssh(command, check=check)


def unique_name() -> str:
    """A cluster name no other session picks: 32 random bits, so that concurrent runs on one machine
    (two projects' CI, or pytest-xdist's workers) each get their own."""
    return f"{NAME_PREFIX}{secrets.token_hex(4)}"


def state_root(folder: Path) -> Path:
    """Where the session's cluster keeps its keys and record (HPCBOX_MINICLUSTER_STATE for the session)."""
    return folder / "state"


def start(
    name: str, settings: ClusterSettings, project_root: Path, folder: Path, *, say: Say
) -> SessionCluster:
    """Bring up cluster ``name`` as ``settings`` say, for the project around ``project_root``, its state
    in ``folder``. The project is read first, so that a project hpcbox cannot read fails before any
    container starts; a start that fails removes what it made. HPCBOX_MINICLUSTER_STATE must name
    ``state_root(folder)``: the site reads the cluster's keys from there."""
    from hpcbox import minicluster
    from hpcbox.api import Site
    from hpcbox.project.config import load_project

    project = dataclasses.replace(
        load_project(project_root), ledger_dir=folder / "jobs", results_dir=folder / "runs"
    )
    version = minicluster.slurm_like(settings.profile, settings.slurm, say=say)
    spec = minicluster.spec_like(settings.profile, name=name, port=free_port(), slurm=version)
    cluster = minicluster.up(spec, state_root(folder), on_line=say)
    via = None if settings.profile == DEFAULT_PROFILE else "local"
    site = Site(settings.profile, via=via, mini_cluster=name, project=project)
    return SessionCluster(name, site, cluster, folder)


def stop(name: str, folder: Path) -> Removed:
    """Remove cluster ``name``: its containers, network and volumes, whatever runs there, and its keys."""
    from hpcbox import minicluster

    return minicluster.down(name, state_root(folder))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for the login node's SSH."""
    from hpcbox.tools.proc import free_local_port  # here, not at import: the plugin loads no more of hpcbox

    return free_local_port()


@contextlib.contextmanager
def running(
    settings: ClusterSettings, project_root: Path, folder: Path, *, say: Say
) -> Iterator[SessionCluster]:
    """A cluster of its own for the block (the pytest fixture's session, a `hpcbox ci` run), named
    uniquely, its state in ``folder``: meanwhile hpcbox in this process finds mini clusters there alone
    (HPCBOX_MINICLUSTER_STATE), so nothing reaches the user's own, and SIGTERM (a CI runner cancelling)
    interrupts as Ctrl-C does. Removed on every way out; a start that fails removes what it made and
    raises its own error (where the engine does not answer, the removal fails too)."""
    name = unique_name()
    started = time.monotonic()
    remove_orphans(say)
    previous = os.environ.get(STATE_VARIABLE)
    os.environ[STATE_VARIABLE] = str(state_root(folder))
    try:
        with _interrupt_on_sigterm(), _owned(name, folder):
            say(f"hpcbox: starting mini cluster {name}, shaped like {settings.profile}")
            try:
                handle = start(name, settings, project_root, folder, say=_prefixed(say))
            except BaseException:
                with contextlib.suppress(Exception):
                    _remove(name, folder, say)
                raise
            say(
                f"hpcbox: mini cluster {name} is up (like {handle.profile}, Slurm {handle.slurm}) "
                f"in {time.monotonic() - started:.0f} s"
            )
            try:
                yield handle
            finally:
                _remove(name, folder, say)
    finally:
        if previous is None:
            os.environ.pop(STATE_VARIABLE, None)
        else:
            os.environ[STATE_VARIABLE] = previous


def _owners() -> Path:
    """The user's folder of session clusters' owner files (in the private folder: 0700)."""
    from hpcbox.files import private_folder

    folder = private_folder() / OWNERS
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


@contextlib.contextmanager
def _owned(name: str, folder: Path) -> Iterator[None]:
    """Cluster ``name`` this process's for the block: its owner file, naming the session's ``folder``
    and flock'ed meanwhile (the kernel frees the lock however the process ends, SIGKILL included), made
    before the cluster's first container and removed after its last."""
    path = _owners() / f"{name}.lock"
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(str(folder))
        handle.flush()
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


def orphans() -> Iterator[tuple[str, Path | None]]:
    """The session clusters whose owner file no process holds (their sessions killed outright, or a CI
    runner lost): each name with its session's folder (None where that is gone), its owner file locked
    by this process until the next is asked for, then removed. A cluster whose owner file is not in
    this user's folder on this machine is never among them (another user's, or a session's in another
    container)."""
    for path in sorted(_owners().glob(f"{NAME_PREFIX}*.lock")):
        try:
            handle = open(path)  # noqa: SIM115  (closed below, on every way out)
        except FileNotFoundError:
            continue  # its session removed its cluster meanwhile
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its session runs
            folder = handle.read().strip()
            if not folder:
                continue  # a session between making its file and locking it
            yield path.name.removesuffix(".lock"), Path(folder) if Path(folder).is_dir() else None
            path.unlink(missing_ok=True)


def remove_orphans(say: Say) -> list[str]:
    """Remove the clusters `orphans` finds, saying so; their names."""
    removed = []
    for name, folder in orphans():
        say(f"hpcbox: removing mini cluster {name}, left by a test session that ended without removing it")
        # Its session's folder may be gone with that session's temporary files: its keys then too.
        with tempfile.TemporaryDirectory() as elsewhere:
            stop(name, folder or Path(elsewhere))
        removed.append(name)
    return removed


def _remove(name: str, folder: Path, say: Say) -> None:
    """Remove the cluster, a second Ctrl-C, SIGTERM or SIGHUP held off until it is gone (a few seconds): one
    arriving mid-way would leave containers behind."""
    say(f"hpcbox: removing mini cluster {name}")
    with signals_held() as held:
        removed = stop(name, folder)
    again = f" (interrupted again meanwhile: {', '.join(held)} held off until it was gone)" if held else ""
    say(
        f"hpcbox: removed mini cluster {name}: {len(removed.containers)} containers, "
        f"{len(removed.networks)} network(s), {len(removed.volumes)} volume(s){again}"
    )


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the cluster is up, so that the session (or command) ends
    as after Ctrl-C, through its clean-up. Only in the main thread, and only where nothing else handles
    SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _prefixed(say: Say) -> Say:
    """hpcbox's progress lines from the cluster's start, each marked as hpcbox's."""
    return lambda line: say(line if line.startswith("hpcbox") else f"hpcbox: {line}")
