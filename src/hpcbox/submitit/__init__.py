"""hpcbox.submitit: submitit's `Executor` and `Job` over hpcbox: a Python function runs in the project's
environment SIF on a Slurm site reached over the user's own SSH (or on the mini cluster).

    from hpcbox.submitit import Executor

    executor = Executor("calls", cluster="edi")
    executor.update_parameters(timeout_min=30, gpus_per_node=1, partition="gpu")
    job = executor.submit(train, lr=0.1)  # train: a function of the project's code
    print(job.result())

Where submitit is installed, `submitit.AutoExecutor(folder, cluster="hpcbox", hpcbox_cluster="edi")`
reaches the same executor (hpcbox.submitit.plugin), and its errors are submitit's own.
"""

from hpcbox.submitit.executor import Executor, FailedJobError, Job, JobPaths, UncompletedJobError

__all__ = ["Executor", "FailedJobError", "Job", "JobPaths", "UncompletedJobError"]
