"""What `invoke submit` costs: time and bytes, first to a cluster that has nothing, then after a
code-only change, each measured to the job id and to the job RUNNING on an idle mini cluster.

The whole command is timed from its start (the earlier stages' up-to-date checks included, as a user
waits for them), with the environment image and its SIF already built; the first submit uploads the
SIF and the dataset, the second only a new code snapshot. Both in one run, side by side.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

from hpcbox import jobs, minicluster
from hpcbox.build.image import build_image
from hpcbox.cli.demo import make_dataset
from hpcbox.project.config import load_project
from hpcbox.render import profiles, resources
from hpcbox.tools import slurm, ssh

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("pyproject.toml", "docker", "src/hpctrain")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _copy_project(into: Path) -> Path:
    for name in PROJECT_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, into / name)
    return into


def _submit_and_time(project, cluster, data: Path) -> dict:
    quiet = lambda _line: None  # noqa: E731
    started = time.perf_counter()
    profile = profiles.load_profile("local")
    payload, environment = jobs.prepare_payload(
        project, data, profile.apptainer.compression, flavour="cpu", offline=True, say=quiet
    )
    checked = resources.resolve(profile, resources.ResourceRequest(job_name="bench", time="10"))
    record = jobs.submit(
        project, profile, cluster.ssh_target(), checked, ("--epochs", "1000"), payload,
        image=environment.ref, say=quiet,
    )  # fmt: skip
    to_job_id = time.perf_counter() - started
    with ssh.Connection(cluster.ssh_target()) as connection:
        jobs.wait(connection, record, until=lambda found: found.state == "RUNNING", poll_s=0.1, timeout_s=120)
        to_running = time.perf_counter() - started
        slurm.cancel(connection, record.job_id)
        jobs.wait(connection, record, poll_s=0.5, timeout_s=120)
    return {"to_job_id": to_job_id, "to_running": to_running, "bytes": record.bytes_sent, "sent": record.sent}


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-submit-") as work:
        root = _copy_project(Path(work))
        project = load_project(root)
        image = build_image(project, flavour="cpu", offline=True, say=lambda _: None, on_line=lambda _: None)
        data = make_dataset(project, image.ref, say=lambda _: None)
        # The environment image and its SIF exist before the clock starts (a user has built them).
        jobs.prepare_payload(
            project,
            data,
            profiles.load_profile("local").apptainer.compression,
            flavour="cpu",
            offline=True,
            say=lambda _: None,
        )
        spec = minicluster.ClusterSpec(name=f"hpcboxbench-{uuid.uuid4().hex[:8]}", port=_free_port())
        try:
            cluster = minicluster.up(spec, root / ".hpcbox" / "cluster")
            first = _submit_and_time(project, cluster, data)
            init = root / "src" / "hpctrain" / "__init__.py"
            init.write_text(init.read_text() + f"\n# bench {uuid.uuid4().hex}\n")
            second = _submit_and_time(project, cluster, data)
        finally:
            minicluster.down(spec.name, root / ".hpcbox" / "cluster")
    first_note = f"sent {', '.join(first['sent'])}; cpu environment SIF"
    second_note = f"sent {', '.join(second['sent'])}"
    return [
        _row("first_submit_to_job_id", first["to_job_id"], "s", None, first_note),
        _row("first_submit_to_running", first["to_running"], "s", None, first_note),
        _row(
            "first_submit_bytes_sent", first["bytes"], "bytes", None, "rsync's count, plus the code archive"
        ),
        _row("code_change_submit_to_job_id", second["to_job_id"], "s", "<= 3 s", second_note),
        _row("code_change_submit_to_running", second["to_running"], "s", "<= 5 s", second_note),
        _row("code_change_submit_bytes_sent", second["bytes"], "bytes", "<= 1 MB", second_note),
        _row(
            "code_change_vs_first_time_to_job_id",
            second["to_job_id"] / first["to_job_id"],
            "ratio",
            None,
            None,
        ),
    ]


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3) if isinstance(value, float) else value, "unit": unit,
            "target": target, "note": note}  # fmt: skip
