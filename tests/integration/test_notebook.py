"""`hpcbox notebook` on the real mini cluster, end to end: JupyterLab from the notebook stage's SIF on a
compute node, forwarded through the command's SSH connection; a real headless Chromium (Debian's) loads
the lab page through the forward, a kernel runs code inside the SIF over Jupyter's REST and websocket
API (as JupyterLab does), `--attach` from a second process reaches the same kernel, and Ctrl-C ends the
job, the forward and the node's scratch, leaving the notebook's files to fetch.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from tests.fixtures.images import Browser
from tests.fixtures.submitting import Setup
from tests.integration.test_submit import REPO, invoke

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

STARTS_WITHIN_S = 1200  # the first notebook builds its image and SIF, and uploads it


class Notebook:
    """`hpcbox notebook` running in a process of its own: its URL on stdout, its words on stderr."""

    def __init__(self, setup: Setup, *flags: str) -> None:
        self.stderr_path = setup.project_dir / f".notebook-{uuid.uuid4().hex[:8]}.err"
        self.stderr = self.stderr_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "invoke", "-r", str(REPO), "notebook", *flags],
            cwd=setup.project_dir,
            env={**os.environ, **setup.env},
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )

    @property
    def said(self) -> str:
        return self.stderr_path.read_text()

    def url(self, timeout_s: float) -> str:
        """The first line it prints: the lab's URL."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        assert ready, f"no URL within {timeout_s} s: {self.said}"
        line = self.process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/lab\?token=[0-9a-f]{48}", line), line + self.said
        return line

    def stop(self, signum: int, timeout_s: float = 180) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=timeout_s)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()
        self.stderr_path.unlink(missing_ok=True)


def api(url: str, path: str, method: str = "GET", body: dict | None = None) -> object:
    """Jupyter's REST API at ``url`` (the lab's URL, with its token)."""
    base, token = url.split("/lab?token=")
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def run_cell(url: str, kernel_id: str, code: str, timeout_s: float = 120) -> str:
    """What ``code`` prints in the kernel, sent as JupyterLab sends a cell: an execute_request over the
    kernel's websocket channels."""
    import websocket

    base, token = url.split("/lab?token=")
    socket = websocket.create_connection(
        f"{base.replace('http', 'ws', 1)}/api/kernels/{kernel_id}/channels?token={token}", timeout=timeout_s
    )
    try:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "date": "",
                  "msg_type": "execute_request", "version": "5.3"}  # fmt: skip
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}  # fmt: skip
        message = {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": "shell",
        }
        socket.send(json.dumps(message))
        printed, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = json.loads(socket.recv())
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "stream":
                printed.append(reply["content"]["text"])
            elif kind == "error":
                raise AssertionError("\n".join(reply["content"]["traceback"]))
            elif kind == "status" and reply["content"]["execution_state"] == "idle":
                return "".join(printed)
        raise AssertionError(f"no answer to the cell within {timeout_s} s")
    finally:
        socket.close()


def locked_torch_version() -> str:
    """PyTorch's version in the cpu flavour, as its Debian lock pins it (2.6.0+dfsg-7 is 2.6.0)."""
    lock = (REPO / "docker" / "lock" / "apt-cpu.txt").read_text()
    return re.search(r"^python3-torch=(?:\d+:)?([0-9.]+)", lock, re.MULTILINE)[1]


def port_answers(url: str) -> bool:
    try:
        api(url, "/api/status")
        return True
    except OSError:
        return False


# The addresses Jupyter's server listens on, on its node: the TCP sockets of the jupyter-lab process in
# /proc/net/tcp (state 0A, LISTEN), each address written back from the kernel's little-endian hex.
JUPYTER_LISTENS_ON = r"""
pid=$(pgrep --full --oldest '^[^ ]*python[0-9.]* [^ ]*jupyter-lab ') || exit 1
declare -A mine
for fd in /proc/"$pid"/fd/*; do
    target=$(readlink "$fd") && [[ $target =~ ^socket:\[([0-9]+)\]$ ]] && mine[${BASH_REMATCH[1]}]=1
done
while read -r _ address _ state _ _ _ _ _ inode _; do
    if [[ $state == 0A && -n ${mine[$inode]:-} ]]; then
        a=${address%%:*}
        printf '%d.%d.%d.%d\n' "0x${a:6:2}" "0x${a:4:2}" "0x${a:2:2}" "0x${a:0:2}"
    fi
done < <(tail -n +2 /proc/net/tcp)
"""


def test_a_notebook_runs_in_the_sif_reached_by_a_browser_and_a_second_terminal_and_ctrl_c_ends_it(
    setup: Setup, minicluster, browser: Browser
):
    # A store of its own on the cluster: test_submit's first submit finds the session's empty.
    first = Notebook(
        setup, "--cluster=local", f"--data={setup.data}", "--flavour=cpu", "--offline", "--time=30",
        "--remote-root=hpcbox-notebook",
    )  # fmt: skip
    second = None
    try:
        url = first.url(STARTS_WITHIN_S)
        job_id = re.search(r"notebook job (\d+) submitted", first.said)[1]

        # A real browser loads the lab page through the forward; JupyterLab's own script builds the shell.
        page = browser.dom(url)
        assert "jp-LabShell" in page, page[-2000:]

        # A cell, as JupyterLab sends it, runs inside the SIF: the environment's PyTorch, the code at
        # /code, the dataset on node scratch.
        kernel = api(url, "/api/kernels", "POST", {"name": "python3"})
        printed = run_cell(
            url,
            kernel["id"],
            "import os, torch\nprint(torch.__version__)\nprint(sorted(os.listdir('/code')))\n"
            "print(sorted(os.listdir('/scratch/data')))",
        )
        version, code, data = printed.splitlines()
        assert version.startswith(locked_torch_version()), printed
        assert "hpctrain" in code and "manifest.json" in data, printed
        # Jupyter listens on node1's own address (where the login node's forward reaches it), not on
        # every interface of the node.
        listening = minicluster.ask("node1", ["bash", "-c", JUPYTER_LISTENS_ON]).stdout.split()
        node1 = minicluster.ask("node1", ["hostname", "-i"]).stdout.split()[0]
        assert listening and set(listening) == {node1}, (listening, node1)
        api(url, "/api/contents/out/kept.ipynb", "PUT", {"type": "notebook", "content": {
            "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})  # fmt: skip

        # A second terminal reaches the same notebook, on a port of its own, and leaves it running.
        second = Notebook(setup, "--cluster=local", "--attach", "-j", job_id)
        again = second.url(120)
        assert again != url
        assert kernel["id"] in [k["id"] for k in api(again, "/api/kernels")]
        assert second.stop(signal.SIGHUP) == 0, second.said
        assert f"notebook job {job_id} goes on" in second.said, second.said
        assert not port_answers(again)  # its forward went with it
        assert port_answers(url)  # the first one's did not, nor the job

        # Ctrl-C ends the job, which copies what the notebook wrote back, and the forward.
        assert first.stop(signal.SIGINT) == 0, first.said
        assert f"ending notebook job {job_id}" in first.said, first.said
        assert not port_answers(url)
        # --cluster: the lane's other modules' rehearsals have jobs of the same ids in the project's ledger.
        status = invoke(setup, "status", "-j", job_id, "--cluster=local")
        assert re.match(rf"job {job_id}: (COMPLETED|CANCELLED)", status.stdout), status.stdout + status.stderr
        left = (
            minicluster.node_container("node1").exec_run(["ls", "/disk/scratch/researcher"]).output.decode()
        )
        assert f"hpcbox-{job_id}" not in left, left
        fetched = invoke(setup, "fetch", "-j", job_id, "--cluster=local")
        assert fetched.returncode == 0, fetched.stderr
        assert (setup.project_dir / "runs" / "local" / job_id / "kept.ipynb").is_file()
    finally:
        if second is not None:
            second.close()
        # Whatever failed (before its URL came, too), the notebook holds no node for the tests after it.
        submitted = re.search(r"notebook job (\d+) submitted", first.said)
        first.close()
        if submitted:
            minicluster.ssh(["scancel", submitted[1]])
