"""`hydra/launcher=hpcbox`: a Hydra multirun as one array job on a Slurm site reached over the user's own
SSH (or on the mini cluster), each point run by Hydra inside the project's environment SIF, from the
laptop, as hydra-submitit-launcher runs one from a login node.

    python train.py -m lr=0.1,0.01,0.001 hydra/launcher=hpcbox hydra.launcher.cluster=edi

Each job's configuration is composed here, where the config files are, and goes with the job; Hydra
runs the task function on it there (hpcbox/submitit/run_hydra_job.py). What a job writes in its output
folder comes back into the sweep's folder here, as a local multirun would leave it, and each job's
return is Hydra's `JobReturn`. The work is hpcbox.submitit's `Executor`: the environment built from
docker/, shipped as a delta, node scratch and clean-up as in every hpcbox job.

With `hydra.launcher.wait=false` the multirun returns as soon as the array job is sent, each job's
return a placeholder (`Sent`); `collect(sweep_dir)` (`hpcbox collect --sweep-dir DIR`), later, from
any process, waits for the jobs, brings their outputs into the sweep's folder and gives their returns.

Hydra imports this module to discover its plugins at every start: it imports nothing of hpcbox until a
multirun launches.
"""

import logging
import pickle
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger(__name__)

# The site's keywords (hpcbox.Site's).
_SITE = ("via", "host", "user", "port", "mini_cluster")
# What a job leaves in its output folder for the launcher, not for the user.
_CALL_FILES = ("result.pkl", "checkpoint.pkl")
# In a sweep's folder: what a launch with wait=false sent, one file per array job, for `collect`.
_SENT = ".hpcbox/sent-{array}.pkl"


@dataclass
class HpcboxLauncherConf:
    """`hydra.launcher.*`: where the sweep runs, and each job's resources: submitit's generic names, the
    commonest of hpcbox's own, and any other of hpcbox's options under ``resources``."""

    _target_: str = "hydra_plugins.hydra_hpcbox_launcher.hpcbox_launcher.HpcboxLauncher"
    cluster: str = "local"  # a cluster profile's name; `local`: the mini cluster
    folder: str = "${hydra.sweep.dir}/.hpcbox"  # each job's pickled call, here
    flavour: str | None = None  # the environment's (default: the one `hpcbox build` last made)
    offline: bool = False  # build on the Debian base bootstrapped here (no registry)
    via: str | None = None
    host: str | None = None
    user: str | None = None
    port: int | None = None
    mini_cluster: str | None = None
    timeout_min: int | None = None
    mem_gb: float | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    name: str = "${hydra.job.name}"
    array_parallelism: int = 256
    wait: bool = True  # false: return once the sweep is sent; `collect` brings its returns in later
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    resources: dict[str, Any] = field(default_factory=dict)  # hpcbox's options: gpu_type, mem, ...


ConfigStore.instance().store(
    group="hydra/launcher", name="hpcbox", node=HpcboxLauncherConf, provider="hpcbox"
)


class HpcboxLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.wait = params.pop("wait", True)  # the launcher's own: not an executor parameter
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra.core.utils import JobRuntime, configure_log, setup_globals

        from hpcbox.submitit.executor import RUN_HYDRA_JOB, NodeFunction

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        executor = self._executor()
        task = _by_name(self.task_function)
        task_name = JobRuntime.instance().get("name")
        calls, subdirs = [], []
        log.info(f"hpcbox: {len(job_overrides)} jobs as one array job on {executor.site.name}")
        for number, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = str(number)  # Slurm's, once the job runs
                config.hydra.job.num = number
            subdirs.append(str(OmegaConf.select(config, "hydra.sweep.subdir")))
            calls.append((NodeFunction("run_hydra_job", "run"), (task, _portable(config), task_name), {}))
        jobs = executor._submit_calls(calls, array=True, beside=(RUN_HYDRA_JOB,), script_by_name=True)
        array = jobs[0].job_id.split("_")[0]
        points = [
            (number, list(overrides), subdir, job)
            for number, (job, overrides, subdir) in enumerate(
                zip(jobs, job_overrides, subdirs, strict=True), start=initial_job_idx
            )
        ]
        if not self.wait:
            sent = sweep_dir / _SENT.format(array=array)
            sent.parent.mkdir(parents=True, exist_ok=True)
            sent.write_bytes(pickle.dumps(points))
            log.info(
                f"hpcbox: array job {array} sent; its {len(jobs)} returns are placeholders until "
                f"collected: `hpcbox collect --sweep-dir {sweep_dir}`"
            )
            return [
                JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=Sent(job.job_id))
                for _, overrides, _, job in points
            ]
        log.info(f"hpcbox: array job {array}; waiting for its {len(jobs)} jobs")
        return [_collected(sweep_dir, *point, log.info) for point in points]

    def _executor(self):
        from hpcbox.submitit.executor import Executor

        params = {key: value for key, value in self.params.items() if value is not None}
        site = {key: params.pop(key) for key in _SITE if key in params}
        executor = Executor(
            params.pop("folder"), params.pop("cluster"), flavour=params.pop("flavour", None),
            offline=params.pop("offline", False), **site,
        )  # fmt: skip
        resources = params.pop("resources", {})
        executor.update_parameters(**params, **_plain(resources))
        return executor


class Sent:
    """A job's return while it runs, in a multirun sent with `hydra.launcher.wait=false`."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"Sent(job {self.job_id}: its return once collected)"


def collect(sweep_dir: str | Path, say: Callable[[str], None] = log.info) -> list[JobReturn]:
    """The returns of the multirun sent to ``sweep_dir`` with `hydra.launcher.wait=false`, in the order
    of its jobs, once each has ended: each job's outputs come into the sweep's folder, where a multirun
    that waited would have left them. ``say`` is told each job's outcome as it comes."""
    from hpcbox.errors import HpcboxError

    sweep = Path(sweep_dir)
    sent = sorted(sweep.glob(_SENT.format(array="*")), key=lambda path: path.stat().st_mtime)
    if not sent:
        raise HpcboxError(
            f"{sweep} holds no multirun sent with hydra.launcher.wait=false",
            "give the multirun's folder (hydra.sweep.dir), the one its launch named",
        )
    return [_collected(sweep, *point, say) for path in sent for point in pickle.loads(path.read_bytes())]


def _collected(
    sweep_dir: Path, number: int, overrides: list[str], subdir: str, job, say: Callable[[str], None]
) -> JobReturn:
    """The job's return once it has ended, its outputs brought into the sweep's folder."""
    returned = _job_return(job, overrides)
    here = _bring_home(job, sweep_dir / subdir)
    if returned.hydra_cfg is not None and returned.hydra_cfg.hydra.job.chdir:
        returned.working_dir = str(here)
    say(f"\t#{number} : {_outcome(returned)} (job {job.job_id}), its outputs in {here}")
    return returned


def _by_name(task_function: TaskFunction) -> Any:
    """The task function as its module names it: `@hydra.main`'s wrapper of it, where that is the name
    (so that it is pickled by name, not by value)."""
    found: Any = sys.modules.get(task_function.__module__)
    for part in task_function.__qualname__.split("."):
        found = getattr(found, part, None)
    return found if getattr(found, "__wrapped__", None) is task_function else task_function


def _portable(config: DictConfig) -> DictConfig:
    """The job's configuration, with each node of `hydra.*` typed by a plugin made plain: the node's Python
    has Hydra, not this launcher nor a third-party sweeper, whose structured types would not unpickle
    there. Hydra's own types stay, as Hydra on the node asks for them."""
    with read_write(config.hydra), open_dict(config.hydra):
        for key in list(config.hydra):
            kind = OmegaConf.get_type(config.hydra, key)
            if is_dataclass(kind) and not kind.__module__.startswith("hydra."):
                plain = OmegaConf.to_container(config.hydra[key], resolve=True)
                config.hydra[key] = OmegaConf.create(plain)
    return config


def _plain(resources: Any) -> dict[str, Any]:
    return (
        dict(OmegaConf.to_container(resources, resolve=True))
        if OmegaConf.is_config(resources)
        else dict(resources)
    )


def _job_return(job, overrides: list[str]) -> JobReturn:
    """The job's JobReturn, or a failed one holding the error where the job ended without a result
    (time limit, memory, cancel, node failure): Hydra's sweeper raises it when it reads the return."""
    from hpcbox.submitit.executor import UncompletedJobError

    try:
        return job.result()
    except UncompletedJobError as error:
        return JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=error)


def _outcome(returned: JobReturn) -> str:
    """COMPLETED and what it returned (its start, for a long one), or FAILED and its error."""
    said = repr(returned._return_value)
    said = said if len(said) <= 60 else said[:57] + "..."
    verb = "returned" if returned.status == JobStatus.COMPLETED else "raised"
    return f"{returned.status.name}, {verb} {said}"


def _bring_home(job, folder: Path) -> Path:
    """The job's output folder, as fetched, copied into the sweep's folder here."""
    fetched = job.paths.result_pickle.parent
    folder.mkdir(parents=True, exist_ok=True)
    if fetched.is_dir():
        shutil.copytree(
            fetched, folder, dirs_exist_ok=True, ignore=lambda _, names: set(_CALL_FILES) & set(names)
        )
    return folder
