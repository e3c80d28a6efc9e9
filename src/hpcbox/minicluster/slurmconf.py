"""The Slurm configuration files of a mini cluster, rendered from its spec (pure functions)."""

from __future__ import annotations

from hpcbox.minicluster.spec import ClusterSpec

# Timers are short so that a failed node is noticed (and its requeued job restarted) in seconds, not
# the minutes a production cluster waits. cred_expire also sets how long a requeued job waits.
# KillWait stays at Slurm's default: job scripts get those 30 s after scancel's TERM to copy results
# back, and hpcbox's scripts are tested against what sites actually give them.
_TIMERS = {
    "SlurmdTimeout": "10",
    "SlurmctldTimeout": "10",
    "MessageTimeout": "5",
    "KillWait": "30",
    "MinJobAge": "600",
    "InactiveLimit": "0",
    "Waittime": "0",
}


def slurm_conf(spec: ClusterSpec) -> str:
    settings = {
        "ClusterName": spec.slurm_name,
        "SlurmctldHost": "controller",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": "cred_expire=10",
        "SlurmUser": "slurm",
        "SlurmdUser": "root",
        "StateSaveLocation": "/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir": "/var/lib/slurm/slurmd",
        # Containers have no delegated cgroup tree: track processes by parent, enforce nothing.
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/linux",
        "JobAcctGatherFrequency": "task=5",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory",
        "DefMemPerCPU": "500",
        # Nodes are containers on a shared machine: trust the configured sizes, not the host's.
        "SlurmdParameters": "config_overrides",
        "GresTypes": "gpu",
        "AccountingStorageType": "accounting_storage/slurmdbd",
        "AccountingStorageHost": "accounting",
        "AccountingStorageTRES": "gres/gpu",
        "JobCompType": "jobcomp/none",
        "ReturnToService": "2",
        "JobRequeue": "1",
        "MpiDefault": "none",
        "SchedulerType": "sched/backfill",
        "SchedulerParameters": "sched_interval=5",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        **_TIMERS,
    }
    nodes = ",".join(spec.compute_hosts)
    lines = [f"{key}={value}" for key, value in settings.items()]
    lines += [
        f"NodeName={nodes} CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb_per_node} "
        f"Gres=gpu:{spec.gpus_per_node} State=UNKNOWN",
        f"PartitionName=cpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName=gpu Nodes={nodes} MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(spec: ClusterSpec) -> str:
    # A file-less Count= is dropped by slurmd ("Ignoring file-less GPU"); each GPU needs a device
    # path that exists, so hpcbox-node creates /dev/fakegpuN as plain files.
    last = spec.gpus_per_node - 1
    devices = "/dev/fakegpu0" if last == 0 else f"/dev/fakegpu[0-{last}]"
    return f"AutoDetect=off\nName=gpu File={devices}\n"


def slurmdbd_conf(spec: ClusterSpec, db_password: str) -> str:
    settings = {
        "AuthType": "auth/munge",
        "DbdHost": "accounting",
        "SlurmUser": "slurm",
        "StorageType": "accounting_storage/mysql",
        "StorageHost": "localhost",
        "StorageUser": "slurm",
        "StorageLoc": "slurm_acct_db",
        "StoragePass": db_password,
        "PidFile": "/run/slurmdbd.pid",
        "DebugLevel": "info",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())
