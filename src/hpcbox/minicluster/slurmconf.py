"""The Slurm configuration files of a mini cluster, rendered from its spec and shape (pure functions)."""

from __future__ import annotations

import shlex

from hpcbox.errors import HpcboxError
from hpcbox.minicluster.shape import SITE_AREAS_DIR, ClusterShape
from hpcbox.minicluster.spec import ClusterSpec

# Scripts in the node image (minicluster/node/site/) that give jobs the site's per-job scratch variable.
SITE_SCRIPTS = "/usr/local/lib/hpcbox-site"

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


def slurm_conf(spec: ClusterSpec, shape: ClusterShape) -> str:
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
        **enforcement(shape),
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
        # A job over a partition's limits is refused at submission, not left pending for ever.
        "EnforcePartLimits": "ALL",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        **_TIMERS,
    }
    if shape.enforces_associations:
        # As at the site: an account or QOS slurmdbd does not list for the user is refused.
        settings["AccountingStorageEnforce"] = "associations,limits,qos"
    if shape.filters_submissions:
        settings["JobSubmitPlugins"] = "lua"
    if shape.scratch_variable:
        settings["Prolog"] = f"{SITE_SCRIPTS}/prolog.sh"
        settings["Epilog"] = f"{SITE_SCRIPTS}/epilog.sh"
    settings |= preemption(shape)
    # Every task is told that the node's GPUs are placeholders (and, at some sites' shapes, its scratch).
    settings["TaskProlog"] = f"{SITE_SCRIPTS}/task-prolog.sh"
    lines = [f"{key}={value}" for key, value in settings.items()]
    hosts_of = {}
    for hosts, types, partitions in node_groups(spec, shape):
        gres = ",".join(f"gpu:{t}:{shape.gpus_per_type}" for t in types) or f"gpu:{shape.gpus_per_type}"
        lines.append(
            f"NodeName={','.join(hosts)} CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb_per_node} "
            f"Gres={gres} State=UNKNOWN"
        )
        hosts_of.update(dict.fromkeys(partitions, ",".join(hosts)))
    for partition in shape.partitions:
        words = [f"PartitionName={partition.name}", f"Nodes={hosts_of[partition.name]}"]
        words += ["Default=YES"] if partition.default else []
        limit = partition.max_time_minutes
        words.append(f"MaxTime={'INFINITE' if limit is None else limit}")
        words += [f"AllowQos={partition.qos}"] if partition.qos else []
        if shape.preempts:
            # A higher tier's job preempts a lower one's on the nodes they share; the others are never
            # preempted, so that their jobs run as on a cluster without preemption.
            words += (
                ["PriorityTier=1", "PreemptMode=REQUEUE", f"GraceTime={shape.grace_time_s}"]
                if partition.preemptible
                else ["PriorityTier=2", "PreemptMode=OFF"]
            )
        lines.append(" ".join([*words, "State=UP"]))
    return "\n".join(lines) + "\n"


def preemption(shape: ClusterShape) -> dict[str, str]:
    """Preemption by partition, as Slurm's own tests set it up (none where no partition is preemptible):
    the cluster's PreemptMode must be one that preempts for preempt/partition_prio; each partition's
    own (slurm_conf) decides."""
    if not shape.preempts:
        return {}
    settings = {"PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE"}
    if shape.send_user_signal:
        settings["PreemptParameters"] = "send_user_signal"
    return settings


def enforcement(shape: ClusterShape) -> dict[str, str]:
    """How the compute nodes hold a job to its request: with cgroups, as most sites do, or, where the
    engine gives the nodes no cgroups of their own, the way Slurm does without them.

    cgroups (cgroup.conf): each job's processes are tracked in its cgroup; its tasks are held to the
    CPUs (cpuset, and bound by task/affinity as well, as Slurm's docs advise) and the memory it was
    given, and may open only the GPU device files it was given. A process that passes --mem is killed
    by the kernel at once and the job ends OUT_OF_MEMORY.

    Without: processes are tracked by parent; each task is bound to its CPUs (sched_setaffinity; the
    nodes have CAP_SYS_NICE for it); a step whose RSS, sampled every second, passes its --mem is
    killed whole (job script included), and the job ends FAILED 0:9. A spike freed within the second
    goes unseen, and every job can open every GPU device file.
    """
    accounting = {"JobAcctGatherType": "jobacct_gather/linux", "JobAcctGatherFrequency": "task=1"}
    if shape.cgroups:
        return {"ProctrackType": "proctrack/cgroup", "TaskPlugin": "task/cgroup,task/affinity", **accounting}
    return {
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/affinity",
        **accounting,
        "JobAcctGatherParams": "OverMemoryKill",
    }


def cgroup_conf(spec: ClusterSpec, shape: ClusterShape) -> str:
    """cgroup.conf of a cluster whose nodes enforce with cgroups: the node's own tree of the engine's
    cgroup version (hpcbox-node makes it writable), RAM, cores and GPU devices constrained as at a
    cgroup site. On cgroup v2 no systemd runs in a node to delegate slurmd a subtree: IgnoreSystemd, as
    Slurm's docs say for containers, and slurmd makes its stepd scope itself under the namespace's root
    (which hpcbox-node has emptied of processes, so that the root can enable controllers for it)."""
    settings = {"CgroupPlugin": f"cgroup/v{shape.cgroup_version}"}
    if shape.cgroup_version == 2:
        settings["IgnoreSystemd"] = "yes"
        if spec.slurm == "22.05":
            # 22.05 enables the controllers in the cgroups it makes under IgnoreSystemd only when told
            # (its cgroup.conf(5): "intended for development and testing with cgroup/v2"); from 23.02 it
            # always does, and 24.11 calls the option defunct.
            settings["CgroupAutomount"] = "yes"
    settings |= {"ConstrainCores": "yes", "ConstrainRAMSpace": "yes", "ConstrainDevices": "yes"}
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def node_groups(
    spec: ClusterSpec, shape: ClusterShape
) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """(compute hosts, GPU types, partitions) of each of the shape's node groups: the spec's nodes
    shared out in order, the first groups taking one more where they do not divide evenly."""
    groups = shape.node_groups
    if spec.nodes < len(groups):
        layouts = "; ".join(f"{', '.join(names)}: {', '.join(types) or 'untyped'}" for types, names in groups)
        raise HpcboxError(
            f"nodes: a cluster shaped like {shape.profile} needs at least {len(groups)} compute nodes, "
            f"one for each GPU layout of its partitions ({layouts}); {spec.nodes} asked for",
            f"pass --nodes {len(groups)} or more (or leave --nodes out)",
        )
    share, extra = divmod(spec.nodes, len(groups))
    hosts = iter(spec.compute_hosts)
    return [
        (tuple(next(hosts) for _ in range(share + (index < extra))), types, partitions)
        for index, (types, partitions) in enumerate(groups)
    ]


def gres_conf(spec: ClusterSpec, shape: ClusterShape) -> str:
    # A file-less Count= is dropped by slurmd ("Ignoring file-less GPU"); each GPU needs a device
    # file, so hpcbox-node makes /dev/fakegpuN character devices (see node_env): with a device file
    # Slurm sets CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS to the GPUs a job was given, as at a site.
    lines = ["AutoDetect=off"]
    per_type = shape.gpus_per_type
    groups = node_groups(spec, shape)
    for hosts, types, _ in groups:
        # One group: the lines hold for every node. Several: each line names its group's nodes.
        nodes = f"NodeName={','.join(hosts)} " if len(groups) > 1 else ""
        for index, gpu_type in enumerate(types or (None,)):
            first, last = index * per_type, (index + 1) * per_type - 1
            devices = f"/dev/fakegpu{first}" if first == last else f"/dev/fakegpu[{first}-{last}]"
            lines.append(f"{nodes}Name=gpu{f' Type={gpu_type}' if gpu_type else ''} File={devices}")
    return "\n".join(lines) + "\n"


# Whether a job's GPU request (tres_per_node, per_job ...: "gres/gpu:2" or "gres/gpu:V100:2", with
# "gres:" or no prefix in older releases) names no type.
_UNTYPED_GPUS_LUA = """local function untyped_gpus(tres)
    if tres == nil then
        return false
    end
    for entry in string.gmatch(tres, "[^,]+") do
        local gres = string.gsub(entry, "^gres[/:]", "")
        if gres == "gpu" or string.match(gres, "^gpu:%d+$") then
            return true
        end
    end
    return false
end

"""


def job_submit_lua(shape: ClusterShape) -> str:
    """A job_submit filter refusing jobs without an account (or QOS, or a GPU type), as sites that
    require one do."""
    checks = []
    if shape.account_required:
        checks.append(("job_desc.account == nil", "an account with --account", "ESLURM_INVALID_ACCOUNT"))
    if shape.qos_required:
        checks.append(("job_desc.qos == nil", "a QOS with --qos", "ESLURM_INVALID_QOS"))
    if shape.gpu_type_required:
        untyped = " or ".join(
            f"untyped_gpus(job_desc.tres_per_{per})" for per in ("node", "job", "task", "socket")
        )
        # slurm.ERROR: Slurm 22.05 gives Lua no ESLURM_ code for a bad GPU request.
        checks.append((untyped, "a GPU type, e.g. --gres=gpu:TYPE:N", "ERROR"))
    body = "".join(
        f"    if {condition} then\n"
        f'        slurm.log_user("{shape.profile}: name {what}")\n'
        f"        return slurm.{error}\n"
        "    end\n"
        for condition, what, error in checks
    )
    return (
        (_UNTYPED_GPUS_LUA if shape.gpu_type_required else "")
        + "function slurm_job_submit(job_desc, part_list, submit_uid)\n"
        f"{body}"
        "    return slurm.SUCCESS\n"
        "end\n\n"
        "function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)\n"
        "    return slurm.SUCCESS\n"
        "end\n"
    )


def config_files(spec: ClusterSpec, shape: ClusterShape) -> dict[str, tuple[bytes, int]]:
    """Name -> (content, mode) of the configuration every node gets in /etc/hpcbox-init (secrets aside)."""
    files = {
        "slurm.conf": (slurm_conf(spec, shape).encode(), 0o644),
        "gres.conf": (gres_conf(spec, shape).encode(), 0o644),
        "node.env": (node_env(shape).encode(), 0o644),
    }
    if shape.cgroups:
        files["cgroup.conf"] = (cgroup_conf(spec, shape).encode(), 0o644)
    if shape.filters_submissions:
        files["job_submit.lua"] = (job_submit_lua(shape).encode(), 0o644)
    return files


def node_env(shape: ClusterShape) -> str:
    """Shell assignments hpcbox-node reads: the fake GPU devices, scratch, site areas, QOS, stubs, the
    container runtime and FUSE, and the cgroup version the nodes enforce with (empty: none)."""
    values = {
        "FAKE_GPUS": str(shape.gpus_per_node),
        "SCRATCH_DIR": shape.scratch_dir,
        "SCRATCH_VARIABLE": shape.scratch_variable or "",
        "SITE_AREAS": " ".join(shape.site_areas),
        "SITE_AREAS_DIR": SITE_AREAS_DIR,
        "AREA_VARIABLES": " ".join(shape.area_variables),
        "QOS": " ".join(shape.qos),
        "MODULE_STUB": "1" if shape.module_stub else "",
        "RUNTIME": shape.runtime,
        "FUSE": "1" if shape.fuse else "",
        "SQUASHFUSE": "1" if shape.squashfuse else "",
        "ZSTD": "1" if shape.zstd else "",
        "CGROUPS": str(shape.cgroup_version) if shape.cgroups else "",
    }
    return "".join(f"HPCBOX_{key}={shlex.quote(value)}\n" for key, value in values.items())


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
