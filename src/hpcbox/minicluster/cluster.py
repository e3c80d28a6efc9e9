"""A running mini cluster, as users, tests and the node classes reach it."""

from __future__ import annotations

from collections.abc import Sequence
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
