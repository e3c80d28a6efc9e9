"""`hpcbox notebook`: JupyterLab from the project's environment on a compute node, reached from here.

The notebook is a batch job, so it outlives this command and the laptop's sleep: `submit` sends it (the
notebook stage's SIF, NOTEBOOK in place of the project's program). Then, as `--attach` does for one
already running, `serve` waits until Jupyter has started on its node and reads its port and token there,
in a step of the job (`srun --overlap`: the token never leaves node scratch), forwards a free local port
to it through the command's one SSH connection and prints the URL once it answers. Ctrl-C ends the job
as `hpcbox cancel` does (what the notebook wrote is copied to its run folder first) and the forward with
it; a closed terminal or a dropped network (SIGHUP, SIGTERM) leaves the job running for `--attach`.
"""

from __future__ import annotations

import html
import json
import math
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import write_atomically
from hpcbox.jobs import follow
from hpcbox.ledger import JobRecord, Ledger
from hpcbox.project.command import NOTEBOOK_RUNTIME_DIR
from hpcbox.project.config import ProjectConfig
from hpcbox.render.profiles import ClusterProfile
from hpcbox.render.resources import Resources
from hpcbox.render.sbatch import job_scratch
from hpcbox.tools import proc, slurm, ssh

START_TIMEOUT_S = 300  # from RUNNING until Jupyter answers: a first start unpacks nothing, yet is slow
POLL_S = 2
WATCH_S = 5  # how often the open notebook's job is asked whether it still runs


class Detached(Exception):
    """The terminal closed or the network dropped: the notebook goes on without this command."""


@dataclass(frozen=True)
class Server:
    """Jupyter on the job's node, as its runtime file says."""

    node: str
    port: int
    token: str


def check_resources(resources: Resources) -> None:
    """A notebook is one process on one node."""
    if resources.nodes != 1 or resources.tasks != 1:
        raise FieldError(
            "nodes" if resources.nodes != 1 else "ntasks_per_node",
            f"a notebook runs one process on one node, not {resources.tasks} on {resources.nodes}",
            "leave out --nodes and --ntasks-per-node (GPUs and CPUs are the notebook's own)",
        )


def last_notebook(project: ProjectConfig, cluster: str) -> str:
    """The job id of the last notebook submitted from ``project`` to ``cluster``."""
    found = [r for r in Ledger(project).all() if r.notebook and cluster in (r.cluster, r.where)]
    if not found:
        raise HpcboxError(
            f"no notebook was started on {cluster} from this project",
            "`hpcbox notebook --cluster` starts one",
        )
    return found[-1].job_id


def require_notebook(record: JobRecord) -> None:
    if not record.notebook:
        raise HpcboxError(
            f"job {record.job_id} is not a notebook", "`hpcbox jobs` lists them; `hpcbox notebook` starts one"
        )


def find_server(
    connection: ssh.Connection,
    profile: ClusterProfile,
    record: JobRecord,
    *,
    timeout_s: float = START_TIMEOUT_S,
    say: Callable[[str], None] = print,
) -> Server:
    """Jupyter's node, port and token, once the job runs and Jupyter has written its runtime file."""
    said_pending = []

    def pending(found: slurm.JobState) -> None:
        if found.state != "RUNNING" and not found.finished and not said_pending:
            why = f" ({found.reason_in_words or found.reason})" if found.reason else ""
            say(f"hpcbox: notebook job {record.job_id} is {found.state}{why}; waiting for a node")
            said_pending.append(found)

    deadline = None
    while True:
        # However long the queue keeps it: a notebook waits for its node as long as you do.
        found = follow.wait(
            connection, record, until=lambda f: f.finished or f.state == "RUNNING", timeout_s=math.inf,
            poll_s=POLL_S, on_change=pending,
        )  # fmt: skip
        if found.finished:
            raise HpcboxError(
                f"notebook job {record.job_id} ended ({found.state}) before Jupyter answered",
                f"its log says why: `hpcbox logs -j {record.job_id}`",
            )
        deadline = deadline or time.monotonic() + timeout_s
        node = found.nodes.split(",")[0]
        server = read_server(connection, profile, record, node)
        if server is not None:
            return server
        if time.monotonic() > deadline:
            raise HpcboxError(
                f"Jupyter did not start on {node} within {timeout_s:.0f} s",
                f"its log says why: `hpcbox logs -j {record.job_id}`",
            )
        time.sleep(POLL_S)


def read_server(
    connection: ssh.Connection, profile: ClusterProfile, record: JobRecord, node: str
) -> Server | None:
    """Jupyter's runtime file, read on ``node`` in a step of the job; None before Jupyter wrote it."""
    # One server per job: the first (only) runtime file of a server, whole (it spans several lines).
    script = (
        f"job_scratch={job_scratch(profile)}\n"
        f'for info in "$job_scratch"/{NOTEBOOK_RUNTIME_DIR}/jpserver-*.json; do cat "$info"; break; done'
    )
    done = connection.run(
        ["srun", f"--jobid={record.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
         "--quiet", "bash", "-c", script],
        what=f"read the notebook's runtime file on {node}",
        check=False,
    )  # fmt: skip
    try:
        info = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        info = None  # not there yet, or half written
    if not isinstance(info, dict) or not info.get("port") or not info.get("token"):
        return None
    return Server(node, int(info["port"]), str(info["token"]))


def forward(connection: ssh.Connection, server: Server, *, timeout_s: float = 30) -> str:
    """A free local port forwarded to ``server`` through ``connection``: the lab's URL, once it answers."""
    port = proc.free_local_port()
    connection.forward(port, server.node, server.port)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={server.token}", timeout=5) as answer:
                if answer.status == 200:
                    return f"{base}/lab?token={server.token}"
        except (urllib.error.URLError, OSError) as failed:
            if time.monotonic() > deadline:
                raise HpcboxError(
                    f"Jupyter on {server.node}:{server.port} does not answer through the forward ({failed})",
                    "try `hpcbox notebook --attach` again",
                ) from failed
        time.sleep(0.5)


def open_in_browser(url: str, folder: Path) -> bool:
    """Open ``url`` where a graphical browser is at hand (a display, or macOS); whether it was. The
    browser is given a page of ``folder`` (yours alone) that leads to ``url``, as Jupyter's own redirect
    file does: the token stays off the browser's command line, which every user of this machine sees."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"):
        return False
    page = folder / "open-jupyterlab.html"
    link = html.escape(url, quote=True)
    write_atomically(
        page,
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={link}"><title>JupyterLab</title></head>\n'
        f'<body><p>On to <a href="{link}">JupyterLab</a>.</p></body></html>\n',
        mode=0o600,
    )
    try:
        return webbrowser.open(page.as_uri())
    except webbrowser.Error:
        return False


@contextmanager
def detaching() -> Iterator[None]:
    """SIGHUP and SIGTERM raise Detached in the block, and Ctrl-C KeyboardInterrupt, even where this
    process was started with SIGINT ignored (in the background of a script, by nohup)."""

    def detach(signum: int, _frame: object) -> None:
        raise Detached(signal.Signals(signum).name)

    before = {signum: signal.signal(signum, detach) for signum in (signal.SIGHUP, signal.SIGTERM)}
    before[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def serve(
    connection: ssh.Connection,
    profile: ClusterProfile,
    record: JobRecord,
    *,
    sent_here: bool = False,
    say: Callable[[str], None] = print,
    show: Callable[[str], None] = print,
) -> None:
    """Reach the notebook of ``record``, print its URL (``show``), and stay until the job ends, Ctrl-C
    ends it, or the terminal goes (the job stays). A job ``sent_here`` (by this command) that cannot be
    reached is ended before the failure is raised: nobody has its URL, and it would hold its node to
    its time limit."""
    again = f"hpcbox notebook --attach -j {record.job_id}"
    with detaching(), tempfile.TemporaryDirectory(prefix="hpcbox-notebook-") as private:
        try:
            try:
                server = find_server(connection, profile, record, say=say)
                url = forward(connection, server)
            except HpcboxError:
                if sent_here:
                    end_unreached(connection, record, say=say)
                raise
            show(url)
            opened = open_in_browser(url, Path(private))
            say(
                f"hpcbox: JupyterLab of job {record.job_id} on {server.node}"
                + (", opened in your browser" if opened else "")
                + f"; Ctrl-C ends the job (what it wrote goes to its run folder); `{again}` from elsewhere"
            )
            while True:
                time.sleep(WATCH_S)
                found = follow.state(connection, record)
                if found.finished:
                    say(f"hpcbox: notebook job {record.job_id} ended: {found.state}")
                    return
        except KeyboardInterrupt:
            say(f"hpcbox: ending notebook job {record.job_id}")
            ended = follow.cancel(connection, record, say=say)
            say(
                f"hpcbox: job {record.job_id} {ended.state}; what the notebook wrote is in {record.run_dir}: "
                f"`hpcbox fetch -j {record.job_id}`"
            )
        except Detached as why:
            say(f"hpcbox: {why} here; notebook job {record.job_id} goes on: `{again}`")


def end_unreached(connection: ssh.Connection, record: JobRecord, *, say: Callable[[str], None]) -> None:
    """End notebook job ``record``, which failed to come up here, as Ctrl-C would; where the login node
    cannot be asked either, say how to end it later (the failure that brought us here is raised)."""
    try:
        if follow.state(connection, record).finished:
            return
        say(f"hpcbox: ending notebook job {record.job_id}: it cannot be reached from here")
        follow.cancel(connection, record, say=say)
    except HpcboxError as failed:
        job_id = record.job_id
        say(f"hpcbox: could not end job {job_id} ({failed.message}): `hpcbox cancel -j {job_id}` ends it")
