"""Bring a mini Slurm cluster up, look at it, take it down.

Layout: one user-defined network; containers `<name>-accounting` (MariaDB + slurmdbd),
`<name>-controller` (slurmctld), `<name>-node1..N` (slurmd, Apptainer) and `<name>-login` (sshd,
published on 127.0.0.1:<port>); volumes `<name>-home` and `<name>-data` shared by the login and
compute nodes. Everything carries the label io.hpcbox.minicluster=<name>, which is how `down` finds
exactly what `up` made. Containers are created, started and waited for through testcontainers, one
class per role (`nodes.py`); finding a running cluster again and removing one go by those labels.

A cluster is the user's, shared by every project on the machine: its keys are under the user's state
folder (state.py), `up` in a second project finds the one the first brought up, and replacing a
cluster Slurm still runs or queues jobs on is refused unless forced (`refuse_unfinished`). One whose
containers stopped (the machine or its Docker engine restarted) is started again, not replaced: Slurm's
saved state and accounting are in its containers, the users' files in its volumes. It is started again
even where it must be replaced (other settings, or a newer node image since): only then can its jobs be
asked for and its results fetched before it goes.
"""

from __future__ import annotations

import dataclasses
import io
import shutil
import socket
import tarfile
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker.errors

from hpcbox.errors import HpcboxError
from hpcbox.minicluster import nodes, state, versions
from hpcbox.minicluster.cluster import Cluster, Incarnation, find, note_removed, record
from hpcbox.minicluster.node_image import ensure_image
from hpcbox.minicluster.secrets import generate
from hpcbox.minicluster.shape import ClusterShape, shape_like
from hpcbox.minicluster.slurmconf import config_files, node_groups
from hpcbox.minicluster.spec import LABEL, ClusterSpec, cluster_command, state_dir
from hpcbox.tools import docker as engine
from hpcbox.tools import proc

DEFAULT_TIMEOUT_S = 180
SQUEUE_TIMEOUT_S = 20  # squeue against a slurmctld that is up answers in well under a second
# Slurm's job states that are an end: a job in any other (pending, running, completing, suspended,
# requeued, held...) still has something to lose when its cluster goes.
ENDED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
     "PREEMPTED", "REVOKED", "TIMEOUT"}
)  # fmt: skip
LISTED_JOBS = 8  # a refusal names this many jobs, then counts the rest: it stays one line
_ALIVE = ("running", "restarting", "paused")  # a container that may still hold a job's processes


def up(
    spec: ClusterSpec,
    state_root: Path,
    *,
    force: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_line: Callable[[str], None] | None = None,
    before_replacing: Callable[[Cluster, str], None] | None = None,
) -> Cluster:
    """A running, ready cluster for ``spec``: the one already up if it matches (whichever project
    brought it up), with its stopped containers started again, else a fresh one. One that must be
    replaced for it (other settings, shape or node image, or a container gone) is replaced only while
    Slurm holds no unfinished job on it, or with ``force``, and after ``before_replacing(cluster, why)``
    has not refused (raised); nothing is removed before that is known, nor before ``spec.port`` is
    known free. One whose containers stopped is started again first, unless forced: stopped, Slurm
    cannot say what it holds, nor can its results be fetched before it goes."""
    say = on_line or (lambda _line: None)
    # A profile that does not exist is refused here, before any build.
    shape = shape_like(spec.like, spec.gpus_per_node).with_gpu_types(spec.added_gpu_types)
    found = engine_cgroups()
    shape = dataclasses.replace(
        shape.with_software(**spec.software),
        cgroups=cgroups_for(spec.cgroups, found),
        cgroup_version=found.version,
    )
    if spec.cgroups is None and not found.possible:
        say(f"cluster {spec.name}: {found.cannot}")
    node_groups(spec, shape)  # too few nodes for its partitions' GPU layouts: refused before any build
    image = ensure_image(slurm=spec.slurm, on_line=on_line)
    with state.locked(state_root, spec.name, say):
        current = find(spec.name, state_root)
        wanted = (spec, image.ref, shape)
        same = current is not None and (current.spec, current.image, current.shape) == wanted
        kept = current is not None and (same or _software_alone_differs(current, wanted))
        found = _containers_of(current) if current is not None else {}
        stopped = _stopped(found) if current is not None and not _missing(current, found) else []
        if current is not None and stopped and (kept or not force):
            if not kept:
                # Stopped, it can be neither asked what Slurm still holds nor fetched from: the refusal
                # below would send the user to a fetch that cannot reach it, and back here.
                say(
                    f"cluster {spec.name} differs ({_why_replaced(current, wanted, state_root)}): "
                    "started again before it is replaced, so that what it holds can be asked for and fetched"
                )
            _start_again(current, found, stopped, timeout_s, say)
            if same:
                return current
        elif current is not None and same and _all_running(current):
            say(f"cluster {spec.name} is already up")
            wait_ready(current, timeout_s)
            return current
        if current is not None and _all_running(current) and _software_alone_differs(current, wanted):
            return _change_software(current, spec, shape, state_root, timeout_s, say)
        containers, networks, volumes = _resources(spec.name)
        if spec.port not in _published_ports(containers):
            _check_port_free(spec.port)  # before anything is removed: a busy port changes nothing
        if containers or networks or volumes:
            why = _why_replaced(current, wanted, state_root)
            refuse_unfinished(spec.name, "replace", why, force=force, say=say)
            if current is not None and before_replacing is not None:
                before_replacing(current, why)
            say(f"replacing the existing cluster {spec.name} ({why})")
            _remove(spec.name, state_root)
            _check_port_free(spec.port)
        directory = state_dir(state_root, spec.name)
        cluster = Cluster(spec, image.ref, generate(spec, directory), shape, Incarnation.new())
        record(cluster, state_root)
        try:
            _start(cluster, timeout_s, say)
        except BaseException:
            _remove(spec.name, state_root)
            raise
        running = slurm_release(cluster) if versions.moves_on(spec.slurm) else None
        if running is not None and (line := versions.moved_note(spec.slurm, running)):
            say(line)
        return cluster


@dataclass(frozen=True)
class EngineCgroups:
    """What the Docker engine can give the compute nodes of cgroups: its cgroup version (``docker
    info``'s CgroupVersion; 0 where it says none) and whether it runs rootless."""

    version: int
    rootless: bool

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> EngineCgroups:
        said = str(info.get("CgroupVersion") or "")
        return cls(int(said) if said.isdigit() else 0, engine.is_rootless(info))

    @property
    def possible(self) -> bool:
        """Whether each compute node can have a cgroup tree of its own for slurmd: a cgroup namespace
        of its own, whose root (the container's cgroup) CAP_SYS_ADMIN makes writable (nodes.py,
        hpcbox-node). Not on a rootless engine, whose containers' capabilities are the user's, not
        root's (the rootless lane, .ci/rootless, runs the mini cluster on one without them)."""
        return self.version in (1, 2) and not self.rootless

    @property
    def cannot(self) -> str:
        """What the nodes of a cluster on this engine do not enforce, in one line."""
        return (
            f"this Docker engine ({self}) gives the compute nodes no cgroups of their own: Slurm's "
            "accounting enforces --mem (FAILED 0:9 within a second, where a cgroup site says "
            "OUT_OF_MEMORY), CPUs are bound but not confined, and a job can open every GPU device file"
        )

    def __str__(self) -> str:
        return f"{'rootless, ' if self.rootless else ''}cgroup v{self.version or '?'}"


def engine_cgroups() -> EngineCgroups:
    return EngineCgroups.from_info(engine.client().info())


def cgroups_for(asked: bool | None, found: EngineCgroups) -> bool:
    """Whether the compute nodes enforce with cgroups: as ``asked``, else where the engine ``found``
    can give them cgroups of their own (cgroup v1 or v2, not rootless)."""
    if asked and not found.possible:
        raise HpcboxError(
            f"cgroups: this Docker engine ({found}) cannot give the mini cluster's nodes cgroups of their "
            "own (a cgroup v1 or v2 engine that is not rootless can)",
            "bring it up without cgroups: Slurm's accounting then enforces --mem (FAILED 0:9)",
        )
    return found.possible if asked is None else asked


def add_gpu_type(
    cluster: Cluster,
    gpu_type: str,
    state_root: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    say: Callable[[str], None] = print,
) -> Cluster:
    """``cluster`` with GPUs of ``gpu_type`` beside its own, for a rehearsal job that names a type its
    profile leaves unknown. Slurm takes new GPU types only at a daemon's start: the controller and the
    compute nodes are restarted with the new configuration (volumes, accounting and the login node stay),
    so it is refused while Slurm holds unfinished jobs there, which the restart would end."""
    with state.locked(state_root, cluster.name, say):
        try:
            held = unfinished_jobs(cluster.name)
        except SlurmSilent as exc:
            raise HpcboxError(f"cannot add {gpu_type} GPUs to cluster {cluster.name}: {exc}") from exc
        if held:
            raise HpcboxError(
                f"the rehearsal {cluster.name} has no {gpu_type} GPUs, and adding them restarts its nodes, "
                f"which would end its unfinished jobs ({', '.join(str(job) for job in held[:LISTED_JOBS])})",
                "wait until they end (`hpcbox cluster.status`), or name a GPU type it has",
            )
        spec = dataclasses.replace(cluster.spec, added_gpu_types=(*cluster.spec.added_gpu_types, gpu_type))
        grown = dataclasses.replace(cluster, spec=spec, shape=cluster.shape.with_gpu_types((gpu_type,)))
        config = config_files(spec, grown.shape)
        for host in spec.hosts:
            grown.put_files(host, nodes.INIT_DIR, config)
        # The login node's client commands read the new file at once; its sshd (and whoever is logged
        # in, this very command perhaps) stays.
        grown.put_files("login", "/etc/slurm", {"slurm.conf": config["slurm.conf"]})
        record(grown, state_root)
        # The compute nodes stopped first and started last: each registers once, with its new GPUs, to
        # a controller that already expects them (an old registration would mark it invalid).
        computes = [grown.node_container(host) for host in spec.compute_hosts]
        for container in computes:
            container.stop(timeout=10)
        grown.node_container("controller").restart(timeout=10)
        for container in computes:
            container.start()
        wait_ready(grown, timeout_s)
        return grown


def _start_again(
    cluster: Cluster,
    containers: dict[str, Any],
    stopped: Sequence[str],
    timeout_s: float,
    say: Callable[[str], None],
) -> None:
    """Start ``cluster``'s ``stopped`` hosts' containers again, as they were made: its jobs, their ids,
    accounting and results are as they were when they stopped (a job that was running then ends as
    Slurm decides for a node that went down under it). The accounting node first, the controller last,
    as `_start`. ``containers``: its hosts' (`_containers_of`)."""
    if "login" in stopped:
        _check_port_free(cluster.login_port)
    name = cluster.name
    say(f"cluster {name}: starting its stopped containers again ({', '.join(stopped)}), its jobs kept")
    down = cluster_command("down", name, "--force")
    for host in sorted(stopped, key=lambda host: (host != "accounting", host == "controller")):
        try:
            containers[host].start()
        except docker.errors.APIError as exc:
            raise HpcboxError(
                f"cluster {name}: starting its {host} container again failed: {exc.explanation or exc}",
                f"look at `docker logs {containers[host].name}`; `{down}`, then `{cluster.spec.up_command}`, "
                "makes it anew (its jobs' results go with it)",
            ) from exc
    wait_ready(cluster, timeout_s)


def _software_alone_differs(current: Cluster, wanted: tuple[ClusterSpec, str, ClusterShape]) -> bool:
    spec, image, shape = wanted
    software = {name: getattr(shape, name) for name in spec.software}
    return (
        current.image == image
        and dataclasses.replace(current.spec, **spec.software) == spec
        and dataclasses.replace(current.shape, **software) == shape
    )


def _change_software(
    current: Cluster,
    spec: ClusterSpec,
    shape: ClusterShape,
    state_root: Path,
    timeout_s: float,
    say: Callable[[str], None],
) -> Cluster:
    """``current`` with another container runtime or FUSE on its compute nodes, changed in place in
    seconds (no daemon restarts: a rehearsal tries each in turn). A job already running keeps what it
    has mounted; its later steps meet the new software."""
    changed = dataclasses.replace(current, spec=spec, shape=shape)
    node_env = {"node.env": config_files(spec, shape)["node.env"]}
    for host in spec.hosts:  # every node's copy, which a restarted node reads too
        changed.put_files(host, nodes.INIT_DIR, node_env)
    for host in (*spec.compute_hosts, "login"):  # the login node shares the compute nodes' software
        done = changed.exec(host, ["hpcbox-node", "software"])
        if done.returncode != 0:
            raise HpcboxError(f"changing {host}'s container software failed: {done.stderr.strip()}")
    record(changed, state_root)
    fuse = "with FUSE" if shape.fuse else "without FUSE"
    tools = "".join(f", without {what}" for what in shape.lacking)
    say(f"cluster {spec.name}: compute nodes now run {shape.runtime}, {fuse}{tools} (changed in place)")
    wait_ready(changed, timeout_s)
    return changed


@dataclass(frozen=True)
class Removed:
    containers: tuple[str, ...]
    networks: tuple[str, ...]
    volumes: tuple[str, ...]


def down(name: str, state_root: Path, *, on_line: Callable[[str], None] | None = None) -> Removed:
    """Remove every container, network and volume labelled for ``name``, and its secrets, whatever runs
    on it: `cluster.down` asks ``refuse_unfinished`` first (test clean-up does not)."""
    with state.locked(state_root, name, on_line or (lambda _line: None)):
        return _remove(name, state_root)


@dataclass(frozen=True)
class UnfinishedJob:
    """A job Slurm still holds: as squeue names it (an array's pending tasks as ``123_[1-4]``)."""

    job_id: str
    state: str
    name: str

    def __str__(self) -> str:
        return f"{self.job_id} {self.name!r} {self.state}"


def parse_unfinished(text: str) -> tuple[UnfinishedJob, ...]:
    """The jobs of ``squeue --format='%i %T %j'`` output (the name last: it may hold spaces) that have
    not ended."""
    found = []
    for line in text.splitlines():
        fields = line.strip().split(" ", 2)
        if len(fields) < 2 or fields[1] in ENDED_STATES:
            continue
        found.append(UnfinishedJob(fields[0], fields[1], fields[2] if len(fields) == 3 else ""))
    return tuple(found)


class SlurmSilent(Exception):
    """The cluster's Slurm cannot say which jobs it holds (why: the message)."""


def unfinished_jobs(name: str) -> tuple[UnfinishedJob, ...]:
    """Every job Slurm holds on cluster ``name`` that has not ended, asked of slurmctld in the controller
    container (no SSH: the keys of a cluster to be replaced may be missing). SlurmSilent if it cannot
    answer."""
    controllers = [c for c in _resources(name)[0] if c.labels.get(nodes.HOST_LABEL) == "controller"]
    if not controllers or controllers[0].status != "running":
        raise SlurmSilent("its controller is not running")
    argv = ["timeout", str(SQUEUE_TIMEOUT_S), "squeue", "--noheader", "--all", "--states=all"]
    try:
        code, (out, err) = controllers[0].exec_run([*argv, "--format=%i %T %j"], demux=True)
    except docker.errors.APIError as exc:
        raise SlurmSilent(f"squeue could not be run: {exc.explanation or exc}") from exc
    if code == 124:
        raise SlurmSilent(f"squeue got no answer from slurmctld in {SQUEUE_TIMEOUT_S} s")
    if code != 0:
        said = (err or out or b"").decode(errors="replace").strip().splitlines()
        raise SlurmSilent(f"squeue failed: {said[-1] if said else f'exit status {code}'}")
    return parse_unfinished((out or b"").decode(errors="replace"))


def refuse_unfinished(
    name: str, verb: str, why: str = "", *, force: bool, say: Callable[[str], None] = print
) -> None:
    """Refuse to ``verb`` ("replace", "remove") cluster ``name`` (because ``why``) while Slurm holds a job
    on it that has not ended, naming them, or while it cannot say (containers of it run, but squeue does
    not answer: a job may still run on a node); with ``force``, say what is lost and go on. A cluster
    none of whose containers runs goes without asking: nothing runs there, and `up` could only
    replace it."""
    if not any(container.status in _ALIVE for container in _resources(name)[0]):
        return
    because = f" ({why})" if why else ""
    status = cluster_command("status", name)
    try:
        held = unfinished_jobs(name)
    except SlurmSilent as exc:
        if not force:
            raise HpcboxError(
                f"cannot tell whether cluster {name} has unfinished Slurm jobs ({exc}): "
                f"{_ing(verb)} it{because} could end them",
                f"pass --force to {verb} it anyway, or look at `docker logs {name}-controller`",
            ) from exc
        say(f"hpcbox: --force: {_ing(verb)} cluster {name}, whose Slurm cannot say what runs there ({exc})")
        return
    if not held:
        return
    listing = ", ".join(str(job) for job in held[:LISTED_JOBS])
    if len(held) > LISTED_JOBS:
        listing += f" and {len(held) - LISTED_JOBS} more"
    several = len(held) > 1
    jobs = f"{len(held)} unfinished Slurm job{'s' if several else ''} ({listing})"
    them, they_end = ("them", "they end") if several else ("it", "it ends")
    if not force:
        raise HpcboxError(
            f"cluster {name} has {jobs}: {_ing(verb)} it{because} would end {them}",
            f"pass --force to {verb} it anyway, or wait until {they_end} (`{status}`)",
        )
    say(f"hpcbox: --force: {_ing(verb)} cluster {name} ends its {jobs}")


def _ing(verb: str) -> str:
    return f"{verb[:-1] if verb.endswith('e') else verb}ing"


def _remove(name: str, state_root: Path) -> Removed:
    note_removed(state_root, name)
    containers, networks, volumes = _resources(name)
    for container in containers:
        container.remove(force=True, v=True)
    for network in networks:
        network.remove()
    for volume in volumes:
        volume.remove(force=True)
    shutil.rmtree(state_dir(state_root, name), ignore_errors=True)
    return Removed(
        tuple(c.name for c in containers), tuple(n.name for n in networks), tuple(v.name for v in volumes)
    )


def status(cluster: Cluster) -> str:
    """The Slurm it runs, what it is shaped like, and `sinfo` and `squeue` as the controller sees them;
    refused, naming them, where some of its containers are not running."""
    found = _containers_of(cluster)
    if stopped := _stopped(found) + _missing(cluster, found):
        several = "s are" if len(stopped) > 1 else " is"
        raise HpcboxError(
            f"cluster {cluster.name} is not up: its {', '.join(stopped)} container{several} not running",
            cluster.start_again,
        )
    sinfo = cluster.ask("controller", ["sinfo"])
    squeue = cluster.ask("controller", ["squeue"])
    shape = "\n".join([running_slurm(cluster), *cluster.shape.describe()])
    return (shape + "\n" + sinfo.stdout + sinfo.stderr + "\n" + squeue.stdout + squeue.stderr).rstrip() + "\n"


def running_slurm(cluster: Cluster) -> str:
    """Which Slurm the cluster runs, as its own `sinfo --version` says (Debian's: `slurm-wlm 22.05.8`)."""
    said = cluster.ask("controller", ["sinfo", "--version"])
    if (release := _release_in(said)) is None:
        why = said.stderr.strip() or (f"exit status {said.returncode}" if said.returncode else "no output")
        return f"Slurm: `sinfo --version` named no release ({why})"
    return f"Slurm {release} on every node (`sinfo --version`)"


def slurm_release(cluster: Cluster) -> str | None:
    """The Slurm the cluster runs (`26.05.5`), None where `sinfo --version` does not say."""
    return _release_in(cluster.ask("controller", ["sinfo", "--version"]))


def _release_in(said: proc.Completed) -> str | None:
    """The release in what `sinfo --version` answered (its last word), None where it failed."""
    words = said.stdout.split()
    return words[-1] if said.returncode == 0 and words else None


def node_states(cluster: Cluster) -> dict[str, str]:
    """Each compute node's state as slurmctld reports it (`sinfo -N`, long form, lower case)."""
    done = cluster.ask("controller", ["sinfo", "--noheader", "--Node", "--format=%N %T"])
    if done.returncode != 0:
        return {}
    return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip())


def wait_ready(cluster: Cluster, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Block until every node of a running cluster passes its role's readiness check, in start order."""
    for host in cluster.spec.hosts:
        readiness = nodes.node_class(host).readiness(cluster, host).with_startup_timeout(timeout_s)
        try:
            readiness.with_poll_interval(nodes.POLL_S).wait_for(cluster.node_container(host))
        except nodes.NodeNotReady as exc:
            raise _not_ready(cluster, exc) from exc


def _start(cluster: Cluster, timeout_s: float, say: Callable[[str], None]) -> None:
    """Create and start every node through its testcontainers class, each waiting until it is ready.

    The accounting node first (slurmctld registers with it), then all others side by side: slurmctld
    resolves every compute node's name as it starts, which Docker's DNS answers only for running
    containers, so the compute nodes go in first and the controller last (a miss costs a 1 s retry).
    """
    spec = cluster.spec
    network = nodes.network(spec)
    network.create()
    for volume in (spec.home_volume, spec.data_volume):
        engine.client().volumes.create(volume, labels={LABEL: spec.name})
    accounting, controller, *others = [
        nodes.node_class(host)(cluster, host, network, timeout_s) for host in spec.hosts
    ]
    made = [accounting, controller, *others]
    try:
        say("starting the accounting node (MariaDB + slurmdbd)")
        accounting.start()
        say(f"starting the controller, {spec.nodes} compute node(s) and the login node")
        with ThreadPoolExecutor(max_workers=len(made) - 1) as pool:
            pending = [pool.submit(node.start) for node in [*others, controller]]
            done, _ = wait(pending, return_when=FIRST_EXCEPTION)
            failed = [started for started in done if started.exception() is not None]
            if failed:
                # Stopping every container ends the other nodes' waits at once (NodeStopped) and keeps
                # the logs for the report; `up` removes them after.
                for container in _resources(spec.name)[0]:
                    container.stop(timeout=0)
                failed[0].result()
    except nodes.NodeNotReady as exc:
        raise _not_ready(cluster, exc) from exc
    finally:
        for node in made:
            node.get_docker_client().client.close()


def _resources(name: str) -> tuple[list[Any], list[Any], list[Any]]:
    client = engine.client()
    selector = {"label": f"{LABEL}={name}"}
    return (
        client.containers.list(all=True, filters=selector, ignore_removed=True),
        client.networks.list(filters=selector),
        client.volumes.list(filters=selector),
    )


def _why_replaced(
    current: Cluster | None, wanted: tuple[ClusterSpec, str, ClusterShape], state_root: Path
) -> str:
    """Why `up` replaces the cluster there is, in a few words: what differs from what was asked."""
    if current is None:
        return f"brought up elsewhere: no keys for it in {state_root}"
    spec, image, shape = wanted
    now, asked = asdict(current.spec), asdict(spec)
    fields = sorted(asked, key=lambda field: field != "like")  # the profile first: it changes most
    changes = [f"{key} {now.get(key)} -> {asked[key]}" for key in fields if now.get(key) != asked[key]]
    if current.image != image:
        changes.append(f"node image {current.image} -> {image}")
    enforcing = {"cgroups": shape.cgroups, "cgroup_version": shape.cgroup_version}
    for name, value in enforcing.items():
        if getattr(current.shape, name) != value:
            changes.append(f"{name} {getattr(current.shape, name)} -> {value}")
    same_cgroups = dataclasses.replace(current.shape, **enforcing)
    if same_cgroups != shape and current.spec.like == spec.like:
        changes.append(f"profile {spec.like} changed")
    if not changes and (missing := _missing(current, _containers_of(current))):
        changes.append(f"its {', '.join(missing)} container{'s' if len(missing) > 1 else ''} gone")
    return ", ".join(changes) or "not all of its containers are running"


def _published_ports(containers: Sequence[Any]) -> set[int]:
    """The host ports ``containers`` publish (running or not): the login node's, once the cluster goes."""
    ports = set()
    for container in containers:
        for bindings in (container.attrs.get("HostConfig", {}).get("PortBindings") or {}).values():
            ports |= {int(binding["HostPort"]) for binding in bindings or [] if binding.get("HostPort")}
    return ports


def login_host_key(name: str) -> str | None:
    """The public host key cluster ``name``'s login container was given at `up` (its /etc/hpcbox-init,
    there whether it runs or not), or None with no such container (or no engine to ask)."""
    try:
        selector = {"label": [f"{LABEL}={name}", f"{nodes.HOST_LABEL}=login"]}
        logins = engine.client().containers.list(all=True, filters=selector, ignore_removed=True)
        if not logins:
            return None
        stream, _ = logins[0].get_archive(f"{nodes.INIT_DIR}/{state.HOST_KEY_PUBLIC}")
    except (HpcboxError, docker.errors.APIError):
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.extractfile(archive.getmembers()[0])
        return member.read().decode(errors="replace").strip() if member else None


def _containers_of(cluster: Cluster) -> dict[str, Any]:
    """``cluster``'s hosts' containers, running or not, by host: one listing of the engine's."""
    selector = {"label": f"{LABEL}={cluster.name}"}
    every = engine.client().containers.list(all=True, filters=selector, ignore_removed=True)
    by_host = {c.labels.get(nodes.HOST_LABEL): c for c in every}
    return {host: by_host[host] for host in cluster.spec.hosts if host in by_host}


def _missing(cluster: Cluster, containers: dict[str, Any]) -> list[str]:
    """The hosts of ``cluster`` that have no container among ``containers`` (`_containers_of`)."""
    return [host for host in cluster.spec.hosts if host not in containers]


def _stopped(containers: dict[str, Any]) -> list[str]:
    """The hosts whose containers (`_containers_of`) are there but not running."""
    return [host for host, container in containers.items() if container.status != "running"]


def _all_running(cluster: Cluster) -> bool:
    containers = {c.labels.get(nodes.HOST_LABEL): c for c in _resources(cluster.name)[0]}
    return set(containers) == set(cluster.spec.hosts) and all(
        c.status == "running" for c in containers.values()
    )


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As Docker binds it: a connection of the cluster just removed, closing (TIME_WAIT), does not
        # hold the port; only something listening there does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise HpcboxError(
                f"port: 127.0.0.1:{port} is already in use",
                "choose another with `--port`, or stop what listens there",
            ) from exc


LOG_LINES = 12  # of the node that is not ready: its last lines, and the controller's about it


def _not_ready(cluster: Cluster, failure: nodes.NodeNotReady) -> HpcboxError:
    """The one line naming the node and what was seen of it, with the lines that explain it: the node's
    own last log lines, and for a compute node the controller's last lines that name it (where slurmctld
    says why it set the node down, or that it stopped answering)."""
    host = failure.host
    containers = {c.labels.get(nodes.HOST_LABEL): c for c in _resources(cluster.name)[0]}
    tails = []
    if (own := containers.get(host)) is not None:
        tails.append(f"--- {own.name}\n{_log_tail(own, LOG_LINES)}")
    controller = containers.get("controller")
    if host in cluster.spec.compute_hosts and controller is not None:
        about = [line for line in _log_tail(controller, 400).splitlines() if host in line][-LOG_LINES:]
        if about:
            tails.append(f"--- {controller.name}, its lines about {host}\n" + "\n".join(about))
    return HpcboxError(
        f"cluster {cluster.name} did not come up: {failure}",
        failure.hint or "the lines that explain it are above; `hpcbox cluster.down` removes the cluster",
        details="\n".join(tails),
    )


def _log_tail(container: Any, lines: int) -> str:
    try:
        return container.logs(tail=lines).decode(errors="replace").rstrip()
    except docker.errors.APIError as exc:
        return f"(its log could not be read: {exc.explanation or exc})"
