"""What `hpcbox watch` costs a look, and how long after a step it shows it, on an idle mini cluster of
its own.

- A look that finds nothing new: the watch's look at a run folder (`jobs.fetch_changed`, what each look
  does: a digest of the folder's listing, and rsync where it changed) once the folder is home, for
  folders of 10, 100 and 1,000 files of 1 MB; its seconds beside the floor (one command over the same
  SSH master: `true`) and its bytes over the wire (the command lines and their answers, rsync's own
  count of its sessions). ROUNDS looks each, medians.
- A look after an event file grew by APPENDED bytes (a 20 MB file, as TensorBoard's): the bytes over
  the wire against those appended; and rsync's delta of the same file (the look before `growing`).
- The lag: a real trainer job watched as `hpcbox watch` does (`Job.fetch(follow=True)`, a look every
  EVERY_S), each line of its metrics from the moment the trainer wrote it on the node (its "time") to
  the moment it was said here; the job copies its small files that changed every LIVE_COPY_S (its
  default `--sync-every` of 10 minutes), which the lag includes.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import free_port, submitting_project
from hpcbox import api, jobs, minicluster
from hpcbox.jobs.fetch import GROWING
from hpcbox.render.sbatch import LIVE_COPY_S
from hpcbox.tools import ssh

ROUNDS = 5
FOLDERS = (10, 100, 1000)  # files of 1 MB in a run folder
APPENDED = 4096
EVERY_S = 10.0  # `hpcbox watch`'s default
ARGS = ("--epochs", "4", "--steps-per-epoch", "20", "--step-pause", "1", "--workers", "0",
        "--log-interval", "5")  # fmt: skip


def run() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-watch-") as work:
        project, state, data = submitting_project(Path(work))
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=free_port())
        try:
            cluster = minicluster.up(spec, state)
            with ssh.Connection(cluster.ssh_target()) as connection:
                looks = _looks(connection, Path(work) / "fetched")
            site = api.Site("local", mini_cluster=spec.name, project=project, say=quiet, on_line=quiet)
            lags = _lags(site, data)
        finally:
            minicluster.down(spec.name, state)
    return _rows(looks, lags)


def _looks(connection: ssh.Connection, home: Path) -> dict[str, list[float]]:
    """Seconds and bytes of looks finding nothing new at each folder size, of the floor, and the bytes
    of looks after an append."""
    measured: dict[str, list[float]] = {"floor": []}
    for files in FOLDERS:
        remote, local = f"bench-watch-{files}", home / str(files)
        fill = f"for i in $(seq {files}); do head -c 1048576 /dev/urandom > {remote}/$i; done"
        connection.run(f"mkdir -p {remote} && {fill}", what="make a run folder")
        seen, _ = jobs.fetch_changed(connection, remote, local, None)  # home once, as the watch's first look
        for _ in range(ROUNDS):
            started = time.perf_counter()
            connection.run("true", what="the floor")
            measured["floor"].append(time.perf_counter() - started)
            counted = Counted(connection)
            started = time.perf_counter()
            jobs.fetch_changed(counted, remote, local, seen)
            measured.setdefault(f"look {files}", []).append(time.perf_counter() - started)
            measured.setdefault(f"bytes {files}", []).append(counted.bytes)
            measured.setdefault("calls", []).append(counted.calls)
    events = "bench-watch-events/events.out.tfevents.1796554314.node1.344.0"  # as the trainer names one
    connection.run(f"mkdir -p bench-watch-events && head -c 20971520 /dev/urandom > {events}", what="events")
    connection.download("bench-watch-events/", home / "events", in_place=True)
    for _ in range(ROUNDS):
        for kind, growing in (("appended", GROWING), ("delta", ())):
            connection.run(f"head -c {APPENDED} /dev/urandom >> {events}", what="append to the event file")
            moved = connection.download(
                "bench-watch-events/", home / "events", in_place=True, growing=growing
            )
            measured.setdefault(kind, []).append(moved.sent + moved.received)
    connection.run("rm -rf bench-watch-*", what="tidy")
    return measured


class Counted:
    """A connection's commands and downloads, their bytes counted: each command's line and answer, and
    rsync's own count of what it sent and received."""

    def __init__(self, connection: ssh.Connection) -> None:
        self.connection, self.bytes, self.calls = connection, 0, 0

    def run(self, command: str, **options):
        done = self.connection.run(command, **options)
        self.bytes += len(command) + len(done.stdout) + len(done.stderr)
        self.calls += 1
        return done

    def download(self, remote_path: str, local: Path, **options) -> ssh.Transfer:
        moved = self.connection.download(remote_path, local, **options)
        self.bytes += moved.sent + moved.received
        self.calls += 1  # a download is one or two rsyncs of several round trips each: counted once
        return moved


def _lags(site: api.Site, data: Path) -> list[float]:
    """Seconds from each metrics line written on the node to its figures said here, for a job watched."""
    said_at: list[float] = []
    job = site.submit(ARGS, data=data, flavour="cpu", offline=True, time="10", job_name="watched")
    local = job.fetch(follow=True, every_s=EVERY_S, on_line=lambda _line: said_at.append(time.time()))
    written = [json.loads(line)["time"] for line in (local / "metrics.jsonl").read_text().splitlines()]
    if len(written) != len(said_at) or job.state().state != "COMPLETED":
        raise RuntimeError(f"{len(said_at)} lines said of {len(written)}; the job {job.state()}")
    return [said - wrote for said, wrote in zip(said_at, written, strict=True)]


def _rows(looks: dict[str, list[float]], lags: list[float]) -> list[dict]:
    floor = statistics.median(looks["floor"])
    rows = [_row("floor: a command over the SSH master", floor, "s", None, "`true`, median of 15")]
    for files in FOLDERS:
        seconds = statistics.median(looks[f"look {files}"])
        rows.append(
            _row(f"a look finding nothing new: {files} files, {files} MB", seconds, "s", None,
                 f"{statistics.median(looks[f'bytes {files}']):,.0f} bytes over the wire; median of {ROUNDS}")
        )  # fmt: skip
        rows.append(_row(f"a look, {files} files / floor", seconds / floor, "ratio", "", ""))
    rows.append(
        _row("a look finding nothing new: calls over the master, the most of any", max(looks["calls"]),
             "calls", "<= 1", "each command and each download one (a download: rsyncs, several round trips)")
    )  # fmt: skip
    appended, delta = statistics.median(looks["appended"]), statistics.median(looks["delta"])
    rows += [
        _row(f"a look after {APPENDED:,} bytes appended to a 20 MB event file: bytes over the wire", appended,
             "bytes", None, f"the new bytes and the file's checksum (--append-verify); median of {ROUNDS}"),
        _row("bytes over the wire / bytes appended", appended / APPENDED, "ratio", None, None),
        _row("the same look by rsync's delta: bytes over the wire", delta, "bytes", None,
             "the look before `growing`: a checksum of every block of the file here, then the new bytes"),
    ]  # fmt: skip
    worst = max(lags)
    note = (
        f"{len(lags)} lines; a look every {EVERY_S:.0f} s; the job copying small files every {LIVE_COPY_S} s"
    )
    rows += [
        _row("lag: a metrics line on the node to its figures here", statistics.median(lags), "s", None, note),
        _row("lag: the worst line", worst, "s", None, None),
        _row("lag median / look interval", statistics.median(lags) / EVERY_S, "ratio", "<= 2", None),
        _row("lag worst / look interval", worst / EVERY_S, "ratio", None, None),
    ]
    return rows


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "target": target, "note": note}
