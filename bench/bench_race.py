"""What a race costs the site that wins it (issue 56: the race to the winner's job id ≤ 1.2× a submit to
the winner alone), on two mini clusters of its own: the winner idle, the job's inputs already there;
the other busy (a job holding each node) and without the SIF, which each race round removes there, so
that its send uploads the whole SIF while the winner's goes to sbatch. The slower site's upload must not
delay the faster site's sbatch (cluv#165: its first design made every cluster wait for the slowest).

ROUNDS rounds, each a race (`hpcbox.race`, to the moment the winner's `Site.submit` returned its job,
and to the end of the race: the winner started, the other cancelled), a submit of the same job to the
winner alone (to its job id), and a race where the other site has the SIF too (what racing costs
without an upload beside it), in turn; each job is cancelled once measured. Medians.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import free_port, submitting_project
from hpcbox import api, minicluster

ROUNDS = 11  # a race and a submit alone differ by tens of milliseconds: the median of many
ARGS = ("--epochs", "1000")
OPTIONS = {"job_name": "race", "time": "10"}
STORE_SIFS = "hpcbox/images"  # under the login user's home: the store's SIFs (store/ship.py)


class TimedSite(api.Site):
    """A Site that notes when each of its submits returned: the real submit, timed."""

    returned_at: float = 0.0

    def submit(self, *args, **kwargs):
        job = super().submit(*args, **kwargs)
        self.returned_at = time.perf_counter()
        return job


def _idle(cluster: minicluster.Cluster, blockers: int = 0) -> None:
    """Until the cluster's queue holds no job but its ``blockers``."""
    while len(cluster.exec("controller", ["squeue", "--noheader"]).stdout.splitlines()) > blockers:
        time.sleep(0.3)


def run() -> list[dict]:
    quiet = lambda _line: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hpcbox-bench-race-") as work:
        project, state, data = submitting_project(Path(work))
        name = f"hpcboxbench-{uuid.uuid4().hex[:8]}"
        specs = [
            minicluster.ClusterSpec(name=f"{name}-{role}", port=free_port()) for role in ("idle", "busy")
        ]
        stages = {"data": data, "flavour": "cpu", "offline": True, **OPTIONS}
        measured: dict[str, list[float]] = {"race_job_id": [], "race_end": [], "alone": [], "race_sent": []}
        first_sent = 0
        try:
            idle, busy = (minicluster.up(spec, state) for spec in specs)
            winner, other = (
                TimedSite("local", mini_cluster=spec.name, project=project, say=quiet, on_line=quiet)
                for spec in specs
            )
            first = winner.submit(ARGS, **stages)  # the winner's inputs there before any clock starts
            first.cancel(outright=True)
            for node in busy.spec.compute_hosts:  # every node of the other site held
                busy.ssh(["sbatch", f"--nodelist={node}", "--exclusive", "--wrap=sleep 3600"], check=True)
            for round_number in range(ROUNDS):
                kinds = ("race", "alone", "race_sent")
                for kind in kinds if round_number % 2 == 0 else kinds[::-1]:
                    _idle(idle)
                    _idle(busy, blockers=len(busy.spec.compute_hosts))
                    if kind == "alone":
                        started = time.perf_counter()
                        job = winner.submit(ARGS, **stages)
                        measured["alone"].append(winner.returned_at - started)
                        job.cancel(outright=True)
                        continue
                    if kind == "race":
                        busy.ssh(["rm", "-rf", STORE_SIFS], check=True)  # its send uploads the SIF again
                    started = time.perf_counter()
                    raced = api.race([winner, other], ARGS, say=quiet, **stages)
                    if kind == "race_sent":  # the other has everything too: the race's own cost alone
                        measured["race_sent"].append(winner.returned_at - started)
                    else:
                        measured["race_end"].append(time.perf_counter() - started)
                        measured["race_job_id"].append(winner.returned_at - started)
                    if raced.kept.site.mini_cluster != specs[0].name:
                        raise RuntimeError(f"the busy site won the race: {raced.kept.record}")
                    raced.kept.cancel(outright=True)
            first_sent = first.record.bytes_sent
        finally:
            for spec in specs:
                minicluster.down(spec.name, state)
    return _rows(measured, first_sent)


def _rows(measured: dict[str, list[float]], first_sent: int) -> list[dict]:
    def runs(kind: str) -> str:
        return ", ".join(f"{each:.2f}" for each in measured[kind])

    ratios = [race / alone for race, alone in zip(measured["race_job_id"], measured["alone"], strict=True)]
    sent_ratios = [race / alone for race, alone in zip(measured["race_sent"], measured["alone"], strict=True)]
    size = f" (the first submit sent {first_sent / 1e6:.0f} MB: SIF, dataset, code)" if first_sent else ""
    return [
        _row("race: to the winner's job id", statistics.median(measured["race_job_id"]), "s", None,
             f"two mini clusters, the other busy and sending the whole SIF{size} meanwhile; median of "
             f"{ROUNDS}; runs {runs('race_job_id')}"),
        _row("submit to the winner alone: to its job id", statistics.median(measured["alone"]), "s", None,
             f"the same job, inputs already there; runs {runs('alone')}"),
        _row("race to the winner's job id / submit alone", statistics.median(ratios), "ratio", "<= 1.2",
             "each race over its round's submit, the median"),
        _row("race with nothing to upload anywhere / submit alone", statistics.median(sent_ratios), "ratio",
             None, f"the other site holding the SIF too: what racing itself costs; runs {runs('race_sent')}"),
        _row("race: to its end (the winner started, the other cancelled)",
             statistics.median(measured["race_end"]), "s", None, f"runs {runs('race_end')}"),
    ]  # fmt: skip


def _row(metric: str, value: float, unit: str, target: str | None, note: str | None) -> dict:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "target": target, "note": note}
