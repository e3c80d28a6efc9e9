"""hpcbox as a submitit plugin: `submitit.AutoExecutor(folder, cluster="hpcbox", hpcbox_cluster="edi")`.

pyproject.toml registers `HpcboxExecutor` in submitit's `executor` entry-point group; submitit names
it `hpcbox` (its class name less "Executor") and hands it the parameters prefixed `hpcbox_`
(`hpcbox_partition`, `hpcbox_slurm_partition`) and the generic ones. Both classes are submitit's own,
their work done by hpcbox.submitit's `Executor` and `Job`. Installed, it changes nothing for a user of
submitit's own executors (`cluster="slurm"`, `"local"`): `AcceptedParameters`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from submitit.core import core, utils

from hpcbox.submitit.executor import Executor, Job


class AcceptedParameters(frozenset):
    """The parameters `HpcboxExecutor` takes, as submitit's AutoExecutor asks for them. It asks twice:
    whether `hpcbox_<name>` names one (every name does here: hpcbox's executor then refuses a misspelt
    one with the valid ones listed), and, going through them, which unprefixed names to rename to an
    executor's (`partition` → `hpcbox_partition`), a table it builds for every cluster, whose later
    executors win. Gone through, this gives none, so that a `cluster="slurm"` user's `partition` stays
    `slurm_partition` as it is without hpcbox."""

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self):
        return iter(())


class HpcboxJob(core.Job):
    """submitit's `Job`, its answers from hpcbox's (no local squeue or sacct: the cluster is over SSH)."""

    def __init__(self, job: Job) -> None:  # no watcher: submitit's reads a local Slurm
        self._hpcbox_job = job
        self._job_id = job.job_id
        self._tasks = (0,)
        self._sub_jobs: list[HpcboxJob] = []
        self._cancel_at_deletion = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # no watcher to register with (submitit's reads a local Slurm)

    @property
    def job_id(self) -> str:
        return self._hpcbox_job.job_id

    @property
    def paths(self) -> utils.JobPaths:  # type: ignore[override]
        return self._hpcbox_job.paths  # type: ignore[return-value]

    @property
    def state(self) -> str:
        return self._hpcbox_job.state

    def submission(self) -> utils.DelayedSubmission:
        call = self._hpcbox_job.submission()
        return utils.DelayedSubmission(call.function, *call.args, **call.kwargs)

    def cancel_at_deletion(self, value: bool = True) -> HpcboxJob:
        self._hpcbox_job.cancel_at_deletion(value)  # hpcbox's job cancels, where this one held it goes
        return self

    def done(self, force_check: bool = False) -> bool:
        return self._hpcbox_job.done()

    def wait(self) -> None:
        self._hpcbox_job.wait()

    def cancel(self, check: bool = True) -> None:
        self._hpcbox_job.cancel()

    def result(self) -> Any:
        return self._hpcbox_job.result()

    def results(self) -> list[Any]:
        return self._hpcbox_job.results()

    def exception(self) -> utils.UncompletedJobError | None:  # type: ignore[override]
        return self._hpcbox_job.exception()

    def stdout(self) -> str | None:
        return self._hpcbox_job.stdout()

    def stderr(self) -> str | None:
        return self._hpcbox_job.stderr()

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"State": self.state}


class HpcboxExecutor(core.Executor):
    """submitit's `Executor` over hpcbox.submitit's: ``cluster`` and the rest as `Executor` takes them."""

    job_class = HpcboxJob

    def __init__(self, folder: str | Path, cluster: str = "local", **site: Any) -> None:
        super().__init__(folder)
        self._hpcbox = Executor(folder, cluster, **site)

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return AcceptedParameters()

    def _convert_parameters(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(params)  # hpcbox.submitit reads submitit's generic names itself

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        self._hpcbox.update_parameters(**kwargs)
        self.parameters = dict(self._hpcbox.parameters)

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job]:
        calls = [(ds.function, tuple(ds.args), dict(ds.kwargs)) for ds in delayed_submissions]
        jobs = self._hpcbox._submit_calls(calls, array=len(calls) > 1)
        return [HpcboxJob(job) for job in jobs]
