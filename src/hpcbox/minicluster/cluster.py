"""A running mini cluster, as users, tests and the node classes reach it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker.errors
from docker.models.containers import Container

from hpcbox.errors import HpcboxError
from hpcbox.minicluster.secrets import ClusterSecrets
from hpcbox.minicluster.shape import ClusterShape
from hpcbox.minicluster.spec import USER, ClusterSpec
from hpcbox.tools import docker as engine
from hpcbox.tools import proc, ssh


@dataclass(frozen=True)
class Cluster:
    """A running mini cluster, as users and tests reach it."""

    spec: ClusterSpec
    image: str
    secrets: ClusterSecrets
    shape: ClusterShape

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def login_port(self) -> int:
        return self.spec.port

    @property
    def user(self) -> str:
        return USER

    @property
    def key_path(self) -> Path:
        return self.secrets.user_key

    @property
    def known_hosts(self) -> Path:
        return self.secrets.known_hosts

    def ssh_target(self) -> ssh.Target:
        return ssh.Target("127.0.0.1", self.login_port, USER, self.key_path, self.known_hosts)

    def ssh(self, command: str | Sequence[str], *, check: bool = False) -> proc.Completed:
        """Run ``command`` on the login node as the cluster user, over SSH."""
        return ssh.run(
            self.ssh_target(), command, what=f"run a command on {self.name}'s login node", check=check
        )

    def node_container(self, host: str) -> Container:
        try:
            return engine.client().containers.get(self.spec.container(host))
        except docker.errors.NotFound as exc:
            raise HpcboxError(
                f"cluster {self.name} has no container for {host}",
                f"bring it up with `hpcbox cluster.up --name {self.name}`",
            ) from exc

    def exec(self, host: str, argv: Sequence[str], *, user: str = "root") -> proc.Completed:
        """Run ``argv`` inside ``host``'s container (as ``user``), bypassing SSH."""
        code, (out, err) = self.node_container(host).exec_run(list(argv), user=user, demux=True)
        return proc.Completed(
            tuple(argv), code, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")
        )

    def put_files(self, host: str, directory: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        """Write ``files`` (name -> content, mode; owned by root) into ``directory`` of ``host``'s
        container, running or not."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name, (content, mode) in files.items():
                member = tarfile.TarInfo(name)
                member.size, member.mode = len(content), mode
                archive.addfile(member, io.BytesIO(content))
        try:
            self.node_container(host).put_archive(directory, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise HpcboxError(f"could not write {', '.join(files)} into {self.name}'s {host}: {exc}") from exc

    def add_account(self, account: str) -> bool:
        """Let the cluster's user submit under ``account``, as a member of it is allowed to at the
        site: the account and the user's association with it, with the QOS the user has already, in
        slurmdbd (which tells slurmctld). Whether it was new."""
        script = (
            'cluster=$(sed -n "s/^ClusterName=//p" /etc/slurm/slurm.conf); '
            f'if sacctmgr --noheader --parsable2 show assoc user={USER} account="$1" format=account '
            "| grep -q .; then echo known; exit 0; fi; "
            f"qos=$(sacctmgr --noheader --parsable2 show assoc user={USER} account=research format=qos "
            "| head -n 1); "
            'sacctmgr --immediate add account "$1" Cluster="$cluster" Description=rehearsal '
            "Organization=hpcbox >/dev/null && "
            f'sacctmgr --immediate add user {USER} Account="$1" Cluster="$cluster" QOS="${{qos:-normal}}" '
            "DefaultQOS=normal >/dev/null && echo added"
        )
        done = self.exec("accounting", ["sh", "-c", script, "sh", account])
        if done.returncode != 0 or done.stdout.strip() not in ("known", "added"):
            raise HpcboxError(
                f"could not add account {account} to cluster {self.name}'s accounting: "
                f"{(done.stderr or done.stdout).strip()}",
                f"is the cluster up? `hpcbox cluster.status --name {self.name}`",
            )
        return done.stdout.strip() == "added"
