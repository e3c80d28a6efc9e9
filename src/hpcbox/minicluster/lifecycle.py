"""Bring a mini Slurm cluster up, look at it, take it down.

Layout: one user-defined network; containers `<name>-accounting` (MariaDB + slurmdbd),
`<name>-controller` (slurmctld), `<name>-node1..N` (slurmd, Apptainer) and `<name>-login` (sshd,
published on 127.0.0.1:<port>); volumes `<name>-home` and `<name>-data` shared by the login and
compute nodes. Everything carries the label io.hpcbox.minicluster=<name>, which is how `down` finds
exactly what `up` made. Containers are created, started and waited for through testcontainers, one
class per role (`nodes.py`); finding a running cluster again and removing one go by those labels.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.minicluster import nodes
from hpcbox.minicluster.cluster import Cluster
from hpcbox.minicluster.node_image import ensure_image
from hpcbox.minicluster.secrets import ClusterSecrets, generate
from hpcbox.minicluster.shape import ClusterShape, shape_like
from hpcbox.minicluster.spec import LABEL, ClusterSpec, state_dir
from hpcbox.tools import docker as engine

DEFAULT_TIMEOUT_S = 180


def up(
    spec: ClusterSpec,
    state_root: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_line: Callable[[str], None] | None = None,
) -> Cluster:
    """A running, ready cluster for ``spec``: the one already up if it matches, else a fresh one."""
    say = on_line or (lambda _line: None)
    image = ensure_image(on_line=on_line)
    current = find(spec.name, state_root)
    shape = shape_like(spec.like, spec.gpus_per_node)
    same = current is not None and (current.spec, current.image, current.shape) == (spec, image.ref, shape)
    if current is not None and same and _all_running(current):
        say(f"cluster {spec.name} is already up")
        wait_ready(current, timeout_s)
        return current
    if _resources(spec.name) != ([], [], []):
        say(f"replacing the existing cluster {spec.name}")
        down(spec.name, state_root)
    _check_port_free(spec.port)
    directory = state_dir(state_root, spec.name)
    cluster = Cluster(spec, image.ref, generate(spec, directory), shape)
    saved = {"spec": asdict(spec), "image": image.ref, "shape": asdict(shape)}
    write_atomically(directory / "cluster.json", json.dumps(saved))
    try:
        _start(cluster, timeout_s, say)
    except BaseException:
        down(spec.name, state_root)
        raise
    return cluster


def find(name: str, state_root: Path) -> Cluster | None:
    """The cluster ``name`` as its last `up` recorded it, or None if none was brought up here."""
    record = state_dir(state_root, name) / "cluster.json"
    if not record.is_file():
        return None
    saved = json.loads(record.read_text())
    if "shape" not in saved:  # brought up by an hpcbox before shapes: `up` replaces it
        return None
    shape = ClusterShape.from_dict(saved["shape"])
    return Cluster(ClusterSpec(**saved["spec"]), saved["image"], ClusterSecrets(record.parent), shape)


@dataclass(frozen=True)
class Removed:
    containers: tuple[str, ...]
    networks: tuple[str, ...]
    volumes: tuple[str, ...]


def down(name: str, state_root: Path) -> Removed:
    """Remove every container, network and volume labelled for ``name``, and its secrets."""
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
    """What the cluster is shaped like, and `sinfo` and `squeue` as the controller sees them."""
    sinfo = cluster.exec("controller", ["sinfo"])
    squeue = cluster.exec("controller", ["squeue"])
    shape = "\n".join(cluster.shape.describe())
    return (shape + "\n" + sinfo.stdout + sinfo.stderr + "\n" + squeue.stdout + squeue.stderr).rstrip() + "\n"


def node_states(cluster: Cluster) -> dict[str, str]:
    """Each compute node's state as slurmctld reports it (`sinfo -N`, long form, lower case)."""
    done = cluster.exec("controller", ["sinfo", "--noheader", "--Node", "--format=%N %T"])
    if done.returncode != 0:
        return {}
    return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if line.strip())


def wait_ready(cluster: Cluster, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Block until every node of a running cluster passes its role's readiness check, in start order."""
    for host in cluster.spec.hosts:
        readiness = nodes.node_class(host).readiness(cluster, host).with_startup_timeout(timeout_s)
        try:
            readiness.with_poll_interval(nodes.POLL_S).wait_for(cluster.node_container(host))
        except (TimeoutError, nodes.NodeStopped) as exc:
            raise _not_ready(cluster, f"{host}: {exc}") from exc


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
    except (TimeoutError, nodes.NodeStopped) as exc:
        raise _not_ready(cluster, str(exc)) from exc
    finally:
        for node in made:
            node.get_docker_client().client.close()


def _resources(name: str) -> tuple[list[Any], list[Any], list[Any]]:
    client = engine.client()
    selector = {"label": f"{LABEL}={name}"}
    return (
        client.containers.list(all=True, filters=selector),
        client.networks.list(filters=selector),
        client.volumes.list(filters=selector),
    )


def _all_running(cluster: Cluster) -> bool:
    containers = {c.labels.get(nodes.HOST_LABEL): c for c in _resources(cluster.name)[0]}
    return set(containers) == set(cluster.spec.hosts) and all(
        c.status == "running" for c in containers.values()
    )


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise HpcboxError(
                f"port: 127.0.0.1:{port} is already in use",
                "choose another with `--port`, or stop what listens there",
            ) from exc


def _not_ready(cluster: Cluster, message: str) -> HpcboxError:
    tails = []
    for container in _resources(cluster.name)[0]:
        logs = container.logs(tail=8).decode(errors="replace").rstrip()
        tails.append(f"--- {container.name}\n{logs}")
    return HpcboxError(
        f"cluster {cluster.name} did not come up: {message}",
        "its container logs are above; `hpcbox cluster.down` cleans up",
        details="\n".join(tails),
    )
