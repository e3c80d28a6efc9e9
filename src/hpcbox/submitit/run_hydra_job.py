"""One job of a Hydra multirun sent by hpcbox's launcher (hydra_plugins.hydra_hpcbox_launcher), run on
the node inside the project's container by run_call.py, beside which it travels. It needs Hydra there
(the project's environment has it: the task function imports it) and nothing of hpcbox.

The job's configuration was composed on the laptop, where the config files are; here Hydra runs the
task function on it as its own launchers do (`run_job`), with the job's output folder
(`$HPCBOX_OUTPUT_DIR`, copied back) as the sweep's folder. The task function comes with the call: by
name where its script is part of the project's code, `@hydra.main`'s wrapper of it then. Where it
raises, the exception goes home in the job's return, its traceback on the node attached as a note.

At the time limit, or a preemption, the runner asks `run.checkpoint` for the call to make instead: the
same job, from its start, in the requeued job (as hydra-submitit-launcher's jobs are). The job's output
folder comes back with it, so a task function resumes from what it saved there.
"""

import collections
import os
import traceback

# What the runner (run_call.py) makes instead of a call cut short, as submitit's DelayedSubmission.
Resubmission = collections.namedtuple("Resubmission", "function args kwargs")


def run(task, config, task_name: str):
    """Hydra's `run_job` of the task function ``task`` on ``config``; its JobReturn."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import JobRuntime, run_job, setup_globals
    from hydra.types import HydraContext
    from omegaconf import open_dict, read_write

    setup_globals()
    JobRuntime.instance().set("name", task_name)
    # By name, a script's task function is `@hydra.main`'s wrapper of it: the function it wraps is the task.
    function = getattr(task, "__wrapped__", task)
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.id = _slurm_job_id()
        config.hydra.sweep.dir = os.environ["HPCBOX_OUTPUT_DIR"]
        config.hydra.sweep.subdir = "."
        config.hydra.runtime.cwd = os.getcwd()  # the laptop's folder does not exist here
    return run_job(
        task_function=_with_traceback(function),
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
        hydra_context=HydraContext(config_loader=None, callbacks=Callbacks(config)),
    )


def checkpoint(task, config, task_name: str) -> Resubmission:
    """The job's call again, for its requeued run."""
    return Resubmission(run, (task, config, task_name), {})


run.checkpoint = checkpoint


def _with_traceback(function):
    def traced(cfg):
        try:
            return function(cfg)
        except Exception as error:
            error.add_note("its traceback on the node:\n" + traceback.format_exc().rstrip())
            raise

    return traced


def _slurm_job_id() -> str:
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID", "unknown")
