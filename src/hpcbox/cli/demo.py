"""`invoke demo`: the whole pipeline on the mini cluster, the way the README's quick start runs it.

build → dataset → cluster up → submit (environment SIF, code, data shipped over SSH) → wait, showing
the job's state as it changes → fetch → the trainer's final figures. Every stage is the one users
call themselves, so a second `invoke demo` rebuilds and re-uploads nothing that did not change.

The cluster comes up beside the build and the dataset (its node image is the other long build of a
first run, and the two leave each other CPU while they fetch and unpack packages), and the SIF
converter's helper image is built after it in the same thread (the trainer image's last packages
configure on one core meanwhile); their lines are held back until the cluster's stage, which then waits
only for what is left of them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcbox import minicluster
from hpcbox.api import Job, Site, describe, up_mini_cluster
from hpcbox.build import baseimage, offlock
from hpcbox.build.image import build_image, record_image
from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.minicluster.spec import DEFAULT_NAME, DEFAULT_PORT
from hpcbox.project.command import EXAMPLE_DATASET
from hpcbox.project.config import ProjectConfig, load_project
from hpcbox.sif import helper
from hpcbox.tools import docker

DEMO_FLAVOUR = "cpu"  # small, and built with no registry (on the bootstrapped Debian base)
DEMO_TIME = "20"  # minutes: far more than the demo's few epochs need on two busy cores


def make_dataset(project: ProjectConfig, image_ref: str, say: Callable[[str], None]) -> Path:
    """The digits archive (`python -m hpctrain make-data`, made in the trainer image), once."""
    path = project.state_dir / EXAMPLE_DATASET
    if path.is_file():
        return path
    say("hpcbox: making the dataset (scikit-learn's digits as one archive of shards)")
    archive = docker.run_for_file(
        image_ref,
        ["python", "-m", "hpctrain", "make-data", "--out", "/tmp/digits.tar"],
        "/tmp/digits.tar",
        what="make the demo dataset",
    )
    write_atomically(path, archive)
    return path


class Stages:
    """The demo's stages as it announces them (`== 2/6 data: ...`), each one's seconds kept, so that
    the closing line says where a first run's minutes went."""

    NAMES = ("build", "data", "cluster", "submit", "job", "results")

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.seconds: dict[str, float] = {}
        self._current: str | None = None
        self._started = time.monotonic()
        self._began = self._started

    def start(self, name: str, what: str) -> None:
        self._finish()
        self._current, self._started = name, time.monotonic()
        self.say(f"== {self.NAMES.index(name) + 1}/{len(self.NAMES)} {name}: {what}")

    def _finish(self) -> None:
        if self._current is not None:
            self.seconds[self._current] = time.monotonic() - self._started
            self._current = None

    def summary(self) -> str:
        """`hpcbox: the demo took 95.2 s: build 40.1 s, data 3.0 s, ...`: the stages so far, timed."""
        self._finish()
        stages = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())
        return f"hpcbox: the demo took {time.monotonic() - self._began:.1f} s: {stages}"


class Beside:
    """``work(on_line)`` in a thread of its own: its lines kept until `result` is asked for, then said,
    and said as they come from then on; `result` waits for it and returns what it returned, or raises
    what it raised."""

    def __init__(self, work: Callable[[Callable[[str], None]], Any], say: Callable[[str], None]) -> None:
        self._say, self._held, self._live = say, [], False
        self._lines = threading.Lock()
        self._outcome: tuple[bool, Any] | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[Callable[[str], None]], Any]) -> None:
        try:
            self._outcome = (True, work(self._line))
        except BaseException as error:  # raised again in the caller's thread, by `result`
            self._outcome = (False, error)

    def _line(self, line: str) -> None:
        with self._lines:
            if not self._live:
                self._held.append(line)
                return
        self._say(line)

    def result(self) -> Any:
        with self._lines:
            self._live, held = True, self._held
        for line in held:
            self._say(line)
        self._thread.join()
        assert self._outcome is not None
        finished, value = self._outcome
        if not finished:
            raise value
        return value


def run_demo(
    *,
    epochs: int = 3,
    name: str = DEFAULT_NAME,
    port: int = DEFAULT_PORT,
    force: bool = False,
    project: ProjectConfig | None = None,
    say: Callable[[str], None] = print,
) -> Job:
    project = project or load_project()
    stages = Stages(say)
    stages.start("build", "the trainer image (cpu flavour, offline); the mini cluster starts beside it")
    # Debian once, first: the cluster's node image and the trainer image both stand on it.
    baseimage.ensure_base(lock=baseimage.own_lock(), say=say)
    # The user's cluster, whichever project brought it up: replaced (ending its jobs) only with force.
    root = minicluster.shared_state(name, project.state_dir, say=say)
    spec = minicluster.ClusterSpec(name=name, port=port)

    def cluster_then_helper(on_line: Callable[[str], None]) -> None:
        up_mini_cluster(spec, root, force=force, say=on_line)
        helper.ensure_helper(strict=offlock.strict_lock(), on_line=lambda _line: None, say=on_line)

    cluster = Beside(cluster_then_helper, say)
    try:
        image = build_image(project, flavour=DEMO_FLAVOUR, offline=True, say=say, on_line=lambda _line: None)
        record_image(project, image)
        stages.start("data", "the digits dataset, one archive of shards")
        data = make_dataset(project, image.ref, say)
    except BaseException:
        # Not a half-started cluster left behind: it ends its start (and is the user's, up) or undoes it.
        say("hpcbox: waiting for the mini cluster to finish starting")
        with contextlib.suppress(Exception):  # what stopped the build is the error to say
            cluster.result()
        raise
    stages.start(
        "cluster", "the mini cluster (Slurm + Apptainer + sshd in containers) and the SIF's helper image, "
        "what is left of them",
    )  # fmt: skip
    cluster.result()
    stages.start("submit", "environment SIF, code snapshot and data to the cluster over SSH, then sbatch")
    # The project's own request for the local cluster ([tool.hpcbox.resources.local]) under the demo's.
    site = Site("local", mini_cluster=name, project=project, say=say, on_line=lambda _line: None)
    job = site.submit(
        ("--epochs", str(epochs)), data=data, flavour=DEMO_FLAVOUR, offline=True, job_name="hpcbox-demo",
        time=DEMO_TIME,
    )  # fmt: skip
    assert job is not None  # not a dry run
    say(f"hpcbox: submitted job {job.job_id}; sent {job.record.bytes_sent:,} bytes")
    stages.start("job", "its state as it changes")
    final = job.wait(on_change=lambda found: say(describe(found)))
    if final.state != "COMPLETED":
        job.logs(on_line=say)
        raise HpcboxError(
            f"the demo job {job.job_id} ended {final.state} ({final.exit_code})",
            "its log is above; `hpcbox cluster.down` and run `invoke demo` again to start afresh",
        )
    stages.start("results", "fetch and report")
    text, png = job.report()
    local = png.parent
    say(f"hpcbox: results in {local}")
    say(summary(local / "metrics.jsonl"))
    say(text)
    say(f"hpcbox: plot {png}")
    say(stages.summary())
    job_id = job.job_id
    say(f"next: `hpcbox status -j {job_id}`, `hpcbox logs -j {job_id}`, `hpcbox report -j {job_id}`")
    say("       and at the end `hpcbox cluster.down`")
    return job


def summary(metrics: Path) -> str:
    """The trainer's final figures from its metrics file."""
    if not metrics.is_file():
        raise HpcboxError(f"the job's metrics file {metrics} is missing", "look at the job's log")
    events = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    epochs = [event for event in events if event["event"] == "epoch"]
    if not epochs:
        raise HpcboxError(f"{metrics} has no epoch line", "look at the job's log")
    last = epochs[-1]
    return (
        f"trained {last['epoch']} epochs: val accuracy {last['val_accuracy']:.3f}, val loss "
        f"{last['val_loss']:.3f}, {last['samples_per_s']:.0f} samples/s, data wait "
        f"{last['data_wait_fraction']:.2f}"
    )
