"""A job raced among clusters and accounts (`submit --cluster=a,b`, `--account=x,y`): sent to every
entrant, the first to start kept and the others cancelled, as cluv's `submit first` races Mila's and
the Alliance's clusters (and a lab's `def-` and `rrg-` accounts on one), with the environment that must
first be on each cluster.

The environment is built once and converted once per compression the sites read, before anything is
sent; then each login node gets its entrants' jobs from a thread of its own (ship what it lacks, a
changed SIF as a delta, sbatch), so that no site waits on another's upload (cluv#165: its first design
made every cluster wait for the slowest sync). Nor does a site's upload share the machine with the
sends of sites that lack nothing: each login's first upload waits until every other login has sent
what needed none, which takes a second, where an upload takes minutes. The jobs are then looked at
together, each site's through its watch, until one has started; the others are cancelled, a loser that
started in the same look too, and said so. Every sent job's ledger entry names the race's jobs and the
one kept."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbox.errors import FieldError, HpcboxError

if TYPE_CHECKING:
    from hpcbox.api.job import Job
    from hpcbox.api.site import Prepared, Site
    from hpcbox.project.command import ContainerCommand
    from hpcbox.render.sweep import Sweep
    from hpcbox.tools.slurm import JobState

Say = Callable[[str], None]
# Where a look at the jobs is due sooner than this, the race sleeps this long between looks.
_LEAST_PAUSE_S = 0.25


@dataclass(frozen=True)
class Entrant:
    """One place a raced job is sent: a site, and the account it is charged to there (None: the
    request's own)."""

    site: Site
    account: str | None = None

    def __str__(self) -> str:
        # Two mini clusters given by name are two sites, though both are `local`.
        mini = f" on mini cluster {self.site.mini_cluster}" if self.site.mini_cluster else ""
        return self.site.where + mini + (f" (account {self.account})" if self.account else "")

    @property
    def options(self) -> dict[str, Any]:
        return {"account": self.account} if self.account else {}


def listed(name: str, value: str | Sequence[str] | None) -> list[str]:
    """The names a race's field gives (``name``: cluster or account), comma-separated or a sequence;
    an empty one refused."""
    if value is None:
        return []
    names = [word.strip() for word in (value.split(",") if isinstance(value, str) else value)]
    if "" in names:
        raise FieldError(
            name, f"{value!r} names an empty {name}", f"separate names with commas: --{name}=a,b"
        )
    return names


def entrants(sites: Sequence[Site], accounts: Sequence[str]) -> list[Entrant]:
    """Each site under each account, where several accounts are given (one is the request's own)."""
    each: Sequence[str | None] = accounts if len(accounts) > 1 else [None]
    return [Entrant(site, account) for site in sites for account in each]


@dataclass(frozen=True)
class Raced:
    """A race's end: the job kept (the first to start), the other entrants' jobs (cancelled, or ended
    before it), and the entrants that could not be sent, each with why."""

    kept: Job
    others: tuple[Job, ...] = ()
    unsent: tuple[tuple[Entrant, HpcboxError], ...] = ()


def race(
    entrants: Sequence[Site | Entrant],
    args: Sequence[str] = (),
    *,
    data: str | Path | None = None,
    flavour: str | None = None,
    offline: bool = False,
    failover_after_s: float | None = None,
    timeout_s: float = math.inf,
    sweep: Sweep | None = None,
    command: ContainerCommand | None = None,
    say: Say | None = None,
    **options: Any,
) -> Raced:
    """Send the job (``args``: the program's arguments; ``options``: its resources, by the option
    table's names) to every entrant (a `Site`, or an `Entrant`: a site and an account), keep the first
    to start (RUNNING, or already ended) and cancel the rest; a site that cannot be sent to is said so
    and raced without. ``failover_after_s``: instead of all at once, one entrant at a time in the order
    given, each given that long to start before it is cancelled and the next is sent (the last waits
    as long as it takes; SkyPilot's failover). ``timeout_s``: how long to wait for a start before
    giving up (the jobs then left as they are, each in the ledger). ``sweep`` and ``command``: as
    `Site.submit` takes them (an array per entrant; what the job runs, if not the project's program)."""
    field = _checked(entrants, options)
    say = say or field[0].site.say
    for entrant in field:  # every request checked before anything is built or sent
        entrant.site.resources({**options, **entrant.options}, command=command, warn=False)
    prepared: dict[str, Prepared] = {}
    for entrant in field:  # built once, converted once per compression, each sent as made
        if entrant.site.compression not in prepared:
            prepared[entrant.site.compression] = entrant.site.prepare(
                data=data, flavour=flavour, offline=offline, command=command, **{**options, **entrant.options}
            )
    sent_with = {"sweep": sweep, "command": command}  # each entrant's submit's, beside the resources
    failed_over: list[Job] = []  # cancelled on the way, for not starting in their time
    if failover_after_s is None:
        sent, unsent = _send(field, tuple(args), sent_with, prepared, options, say)
        if not sent:
            raise _none_sent(unsent)
        started = _first_started(sent, timeout_s, say)
    else:
        sent, unsent, started = _fail_over(
            field, tuple(args), sent_with, prepared, options, failover_after_s, timeout_s, say, failed_over
        )
    kept, _ = started[0]
    others = tuple(job for _, job in sent if job is not kept)
    cancelled = [
        *failed_over,
        *(job for job in others if job not in failed_over and _call_off(job, started, say)),
    ]
    _record(kept, [job for _, job in sent], cancelled, unsent)
    say(f"hpcbox: race: kept job {kept.job_id} on {kept.record.where}, the first to start")
    return Raced(kept, others, tuple(unsent))


def _fail_over(
    field: list[Entrant],
    args: tuple[str, ...],
    sent_with: dict[str, Any],
    prepared: dict[str, Prepared],
    options: dict[str, Any],
    after_s: float,
    timeout_s: float,
    say: Say,
    failed_over: list[Job],
) -> tuple[list[tuple[Entrant, Job]], list[tuple[Entrant, HpcboxError]], list[tuple[Job, JobState]]]:
    """One entrant at a time: each sent and given ``after_s`` to start (the last, ``timeout_s``); one
    that does not start is cancelled (added to ``failed_over``) and the next sent."""
    sent: list[tuple[Entrant, Job]] = []
    unsent: list[tuple[Entrant, HpcboxError]] = []
    for index, entrant in enumerate(field):
        now_sent, now_unsent = _send([entrant], args, sent_with, prepared, options, say)
        sent += now_sent
        unsent += now_unsent
        if not now_sent:
            continue
        last = index == len(field) - 1
        try:
            return sent, unsent, _first_started(now_sent, timeout_s if last else after_s, say)
        except NotStarted:
            if last:
                raise
            job = now_sent[0][1]
            job.cancel(outright=True)
            failed_over.append(job)
            say(
                f"hpcbox: race: job {job.job_id} on {job.record.where} did not start within "
                f"{after_s:g} s; cancelled, trying {field[index + 1]}"
            )
    raise _none_sent(unsent)


def _none_sent(unsent: list[tuple[Entrant, HpcboxError]]) -> HpcboxError:
    reasons = "; ".join(f"{entrant}: {error.message}" for entrant, error in unsent)
    return HpcboxError(f"no entrant of the race could be sent ({reasons})")


class NotStarted(HpcboxError):
    """No job of the race started within the time it was given."""


def _checked(entrants: Sequence[Site | Entrant], options: dict[str, Any]) -> list[Entrant]:
    field = [entrant if isinstance(entrant, Entrant) else Entrant(entrant) for entrant in entrants]
    if len(field) < 2:
        raise FieldError(
            "cluster", "a race needs two entrants or more", "name several: --cluster=a,b or --account=x,y"
        )
    if any(entrant.account for entrant in field) and options.get("account"):
        raise FieldError("account", "give it per entrant or for all, not both")
    names = [str(entrant) for entrant in field]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FieldError("cluster", f"{', '.join(twice)} is named twice in the race", "name each once")
    return field


def _send(
    field: list[Entrant],
    args: tuple[str, ...],
    sent_with: dict[str, Any],
    prepared: dict[str, Prepared],
    options: dict[str, Any],
    say: Say,
) -> tuple[list[tuple[Entrant, Job]], list[tuple[Entrant, HpcboxError]]]:
    """Each login node's entrants sent from a thread of its own (one after another on one login: they
    share its SSH master), uploads held until the logins that lack nothing have sent; what was sent and
    what could not be, in the entrants' order."""
    by_login: dict[object, list[int]] = {}
    for index, entrant in enumerate(field):
        by_login.setdefault(entrant.site.target, []).append(index)
    outcome: dict[int, Job | HpcboxError] = {}
    uploads = _UploadsAfterSends(len(by_login))

    def send(indices: list[int]) -> None:
        try:
            for index in indices:
                entrant = field[index]
                try:
                    made = entrant.site.submit(
                        args, prepared=prepared[entrant.site.compression], before_upload=uploads.hold,
                        **sent_with, **{**options, **entrant.options},
                    )  # fmt: skip
                except HpcboxError as error:
                    outcome[index] = error
                    say(f"hpcbox: race: {entrant} could not be sent ({error.message}); racing on without it")
                    continue
                assert made is not None  # not a dry run
                outcome[index] = made
                say(f"hpcbox: race: {entrant}: job {made.job_id}")
        finally:
            uploads.settled()

    with concurrent.futures.ThreadPoolExecutor(len(by_login)) as pool:
        for done in [pool.submit(send, indices) for indices in by_login.values()]:
            done.result()
    sent = [(field[i], found) for i, found in sorted(outcome.items()) if not isinstance(found, HpcboxError)]
    unsent = [(field[i], found) for i, found in sorted(outcome.items()) if isinstance(found, HpcboxError)]
    return sent, unsent


class _UploadsAfterSends:
    """Holds each sending thread's uploads until every thread has settled: sent all it had, or come to
    an upload of its own. A site that lacks nothing then sends while no upload (ssh's encryption, the
    login's disk) competes with it for this machine; a thread settles once, so threads that both upload
    wait for the others' sends, never for each other's uploads."""

    def __init__(self, threads: int) -> None:
        self._unsettled = threads
        self._changed = threading.Condition()
        self._mine = threading.local()

    def settled(self) -> None:
        if getattr(self._mine, "settled", False):
            return
        self._mine.settled = True
        with self._changed:
            self._unsettled -= 1
            self._changed.notify_all()

    def hold(self) -> None:
        self.settled()
        with self._changed:
            self._changed.wait_for(lambda: self._unsettled == 0)


def _first_started(sent: list[tuple[Entrant, Job]], timeout_s: float, say: Say) -> list[tuple[Job, JobState]]:
    """The jobs started (RUNNING, or ended) at the first look that finds any, in the entrants' order;
    each site's jobs looked at through its watch, on its schedule. Ctrl-C meanwhile ends the race with
    its jobs waiting on as they are, each said with how to cancel it."""
    try:
        return _first_look_started(sent, timeout_s)
    except KeyboardInterrupt:
        for _, job in sent:
            record = job.record
            via = f" --via {record.via}" if record.via else ""
            say(
                f"hpcbox: race stopped: job {job.job_id} on {record.where} waits on as it is "
                f"(`hpcbox cancel -j {job.job_id} --cluster={record.cluster}{via}` if you do not want it)"
            )
        raise


def _first_look_started(sent: list[tuple[Entrant, Job]], timeout_s: float) -> list[tuple[Job, JobState]]:
    deadline = time.monotonic() + timeout_s
    while True:
        started = []
        for _, job in sent:
            try:
                found = job.watch.state(job.job_id)
            except HpcboxError:  # this look said nothing of it (accounting silent, the login away)
                continue
            if found.state == "RUNNING" or found.finished:
                started.append((job, found))
        if started:
            return started
        if time.monotonic() > deadline:
            raise NotStarted(
                f"no job of the race started within {timeout_s:.0f} s",
                "they wait on as they are: `hpcbox jobs` lists them; cancel those you do not want",
            )
        time.sleep(max(_LEAST_PAUSE_S, min(job.watch.due_in_s() for _, job in sent)))


def _call_off(job: Job, started: list[tuple[Job, JobState]], say: Say) -> bool:
    """Cancel a job that lost the race: one that had started too is said so; one that had ended before
    is left as it ended (False); cancelling twice is harmless."""
    had = next((found for each, found in started if each is job), None)
    if had is not None and had.finished:
        say(f"hpcbox: race: job {job.job_id} on {job.record.where} had already ended {had.state}; left so")
        return False
    job.cancel(outright=True)
    also = " (it had started too, in the same look)" if had is not None else ""
    say(f"hpcbox: race: cancelled job {job.job_id} on {job.record.where}{also}")
    return True


def _record(
    kept: Job, jobs: list[Job], cancelled: list[Job], unsent: list[tuple[Entrant, HpcboxError]]
) -> None:
    """Each sent job's ledger entry names the race's jobs, the one kept and those cancelled."""
    from hpcbox.ledger import Ledger

    name = lambda job: f"{job.record.where} job {job.job_id}"  # noqa: E731
    race = {
        "entrants": [name(job) for job in jobs] + [f"{entrant} (not sent)" for entrant, _ in unsent],
        "kept": name(kept),
        "cancelled": [name(job) for job in cancelled],
    }
    for job in jobs:
        job.record = dataclasses.replace(job.record, race=race)
        Ledger(job.site.project).update(job.record)
