"""Reaching a cluster's login node: the profile's, the flags', or the mini cluster brought up here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.ledger import JobRecord
from hpcbox.project.config import ProjectConfig
from hpcbox.render.profiles import ClusterProfile, check_login_word
from hpcbox.render.resources import Resources
from hpcbox.tools import ssh

# Where the mini cluster's login node listens (minicluster.Cluster.ssh_target), whatever its port.
MINI_CLUSTER_HOST = "127.0.0.1"


def require_slurm(profile: ClusterProfile) -> None:
    """Submitting, and everything after it, speaks Slurm (sbatch, squeue, sacct, srun) to the cluster."""
    if profile.lsf:
        raise HpcboxError(
            f"{profile.name} uses LSF: hpcbox renders its bsub script "
            f"(hpcbox sbatch --cluster={profile.name}) but cannot submit to it yet"
        )


def on_mini_cluster(profile: ClusterProfile, via: str | None, host: str | None) -> bool:
    """Whether the job runs on the mini cluster: `local` itself (unless --host points elsewhere), or a
    site's job rehearsed ``via`` "local"."""
    return via == "local" or (profile.name == "local" and host is None)


def connection_target(
    profile: ClusterProfile,
    project: ProjectConfig,
    *,
    via: str | None = None,
    host: str | None = None,
    user: str | None = None,
    port: int | None = None,
    mini_cluster: str | None = None,
) -> ssh.Target:
    """How to reach ``profile``'s login node: flags over the profile; ~/.ssh/config fills the rest.

    `local`, and any cluster ``via`` "local", is the user's mini cluster, whichever project brought it
    up (`hpcbox cluster.up`), reached with the keys kept for it under the user's state folder;
    ``mini_cluster`` (else HPCBOX_MINICLUSTER) names another one, HPCBOX_MINICLUSTER_STATE another
    state folder. It must be shaped like ``profile`` (`--like`).
    """
    if via not in (None, "local"):
        raise FieldError(
            "via", f"{via!r} is not a place to rehearse a job", "use --via local (the mini cluster)"
        )
    check_login_word("host", host)
    check_login_word("user", user)
    if on_mini_cluster(profile, via, host):
        return _mini_cluster(profile, project, mini_cluster).ssh_target()
    login = profile.login
    # Port 22 is ssh's own default: leave it out so that a Port in ~/.ssh/config still applies.
    default_port = login.port if login.port != 22 else None
    return ssh.Target(host or login.host, port or default_port, user or login.user)


@dataclass(frozen=True)
class Place:
    """Where a job ran, as connection_target's flags say it: a rehearsal (``via``), or a login node
    (``host``, ``user``, ``port``; None: the profile's, or ~/.ssh/config's); all None: the profile's
    login, or the mini cluster for `local`."""

    via: str | None = None
    host: str | None = None
    user: str | None = None
    port: int | None = None


def parse_address(address: str) -> tuple[str, str | None, int | None]:
    """``ssh.Target.address`` read back: the host, the user and the port where it names them."""
    user, _, rest = address.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # an IPv6 address with a port: [::1]:2222
        inside, _, after = rest[1:].partition("]")
        host, port = inside, int(after[1:]) if after[1:].isdigit() else None
    elif rest.count(":") == 1 and rest.rsplit(":", 1)[1].isdigit():
        host, port = rest.rsplit(":", 1)[0], int(rest.rsplit(":", 1)[1])
    return host, user or None, port


def place_of(
    record: JobRecord,
    *,
    via: str | None = None,
    host: str | None = None,
    user: str | None = None,
    port: int | None = None,
) -> Place:
    """Where a command about job ``record`` goes (its rerun's submit, its status, logs...): where the
    record says the job ran, a rehearsal on the mini cluster or the login node it was sent to. A flag
    given that says otherwise is refused in one line naming it; one that agrees changes nothing."""
    ran_host, ran_user, ran_port = parse_address(record.host)
    on_mini = record.via is not None or (record.cluster == "local" and ran_host == MINI_CLUSTER_HOST)
    leave_out = "leave it out: a rerun goes where its job ran"
    if on_mini:
        where = f"the mini cluster ({record.where})"
        given = {"host": host, "user": user, "port": port}
        for flag, value in given.items():
            if value is not None:
                raise FieldError(
                    flag,
                    f"job {record.job_id} ran on {where}; --{flag} {value} says otherwise",
                    f"{leave_out}; to run its points at the site, submit them anew with --sweep",
                )
        return Place(via=record.via)
    if via is not None:
        raise FieldError(
            "via",
            f"job {record.job_id} ran on {record.host}, not on the mini cluster (--via {via})",
            f"{leave_out}; to rehearse its points, submit them anew with --sweep and --via {via}",
        )
    ran = {"host": ran_host, "user": ran_user, "port": ran_port}
    # Port 22 and no port name the same port (connection_target leaves 22 to ~/.ssh/config).
    given = {"host": host, "user": user, "port": None if port == 22 and ran_port is None else port}
    for flag, value in given.items():
        if value is not None and value != ran[flag]:
            raise FieldError(
                flag, f"job {record.job_id} ran on {record.host}; --{flag} {value} says otherwise", leave_out
            )
    return Place(host=ran_host, user=ran_user, port=ran_port)


def rehearse(
    profile: ClusterProfile,
    project: ProjectConfig,
    resources: Resources,
    *,
    via: str | None = None,
    host: str | None = None,
    mini_cluster: str | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """On the mini cluster, what the job names that the profile cannot know is made there first, as the
    site would have it: the account, with the cluster's user in it (a profile that lists the site's
    accounts has refused any other already), and GPUs of a type the profile leaves unknown for the
    job's partition (a profile that lists its types has refused any other already)."""
    account, gpu_type = resources.account, resources.gpu_type
    unlisted_type = gpu_type is not None and resources.partition.gpu_types is None
    if (account is None and not unlisted_type) or not on_mini_cluster(profile, via, host):
        return
    running = _mini_cluster(profile, project, mini_cluster)
    if account is not None and running.add_account(account):
        say(f"hpcbox: the rehearsal's accounting has account {account} now, with you in it (as at the site)")
    if not unlisted_type or gpu_type in running.shape.gpu_types:
        return
    from hpcbox import minicluster

    say(
        f"hpcbox: {profile.name}'s profile does not know its GPU types; the rehearsal adds {gpu_type} "
        "GPUs (its controller and compute nodes restart, about 20 s)"
    )
    minicluster.add_gpu_type(running, gpu_type, _state_root(running.name, project.state_dir), say=say)


def say_rehearsal_slurm(
    profile: ClusterProfile,
    project: ProjectConfig,
    *,
    via: str | None,
    mini_cluster: str | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """On a rehearsal (``via`` "local") of a site whose profile names its Slurm version, one line where
    the mini cluster runs another (the nearest it has, or the one `cluster.up --slurm` asked for)."""
    if via != "local" or profile.slurm_version is None:
        return
    from hpcbox.minicluster import versions

    running = _mini_cluster(profile, project, mini_cluster).spec.slurm
    if line := versions.note(profile.name, profile.slurm_version, running):
        say(line)


def _state_root(name: str, project_state: Path | None) -> Path:
    from hpcbox import minicluster

    # Said on stderr, as every progress line of the commands that come here (their stdout is data).
    return minicluster.shared_state(name, project_state, say=lambda line: print(line, file=sys.stderr))


def _mini_cluster(profile: ClusterProfile, project: ProjectConfig, name: str | None):
    return running_mini_cluster(project.state_dir, like=profile.name, name=name)


def running_mini_cluster(project_state: Path | None, *, like: str | None = None, name: str | None = None):
    """The user's mini cluster (``name``, else HPCBOX_MINICLUSTER's, names another), which must be up,
    and shaped like profile ``like`` where one is given. ``project_state``: a checkout's .hpcbox, where
    an older hpcbox kept its keys (adopted from there once)."""
    from hpcbox import minicluster
    from hpcbox.minicluster.spec import DEFAULT_NAME

    name = name or os.environ.get("HPCBOX_MINICLUSTER", DEFAULT_NAME)
    running = minicluster.find(name, _state_root(name, project_state))
    shaped = "" if like in (None, "local") else f" --like {like}"
    if running is None:
        raise HpcboxError(
            f"the mini cluster {name} is not up",
            f"start it with `hpcbox cluster.up{shaped}`",
        )
    if like is not None and running.spec.like != like:
        raise HpcboxError(
            f"the mini cluster {name} is shaped like {running.spec.like!r}, not {like!r}",
            f"reshape it with `hpcbox cluster.up{shaped}`",
        )
    return running
