"""The job's resource options, one row each: everything else reads them from here.

A row gives the option's name (the `ResourceRequest` field; `--name-with-dashes` on the command line;
the same key in `[tool.hpcbox.resources]`), its type, its help, sbatch's letter for it, the sbatch
option it becomes (the #SBATCH header, and `hpcbox shell`'s srun line where ``srun``), the bsub flag
an LSF site's script gives it, and whether `hpcbox shell` takes it. The flags of sbatch, submit and
shell, the pyproject table's checks, the headers and the srun line all come from this table; a new
option is a row here, a field of `ResourceRequest` (a test holds them equal) and its check in
`resources.resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The types a resource option takes: typed text, a whole number, an on/off switch, a repeatable one.
KINDS = (str, int, bool, tuple)


@dataclass(frozen=True)
class ResourceOption:
    """One resource option (see the module's docstring for what reads each column)."""

    name: str
    kind: type
    help: str
    short: str = ""  # sbatch's own letter for it, and no other
    sbatch: str = ""  # the sbatch option it becomes; "" where hpcbox writes it another way or not at all
    srun: bool = False  # `hpcbox shell` passes it to srun as well
    in_shell: bool = True  # a flag of `hpcbox shell`, which runs no job script
    bsub: str = ""  # the #BSUB flag on an LSF site

    @property
    def flag(self) -> str:
        """The long flag, as typed and as the pyproject key: --gpu-type, gpu-type."""
        return self.name.replace("_", "-")

    @property
    def unset(self) -> bool | None:
        """The command line's value when the flag is left out: not asked for."""
        return False if self.kind is bool else None


RESOURCE_OPTIONS = (
    ResourceOption("job_name", str, "job name (default: the project's name)",
                   short="J", sbatch="--job-name", srun=True, bsub="-J"),
    ResourceOption("partition", str,
                   "partition, or queue on an LSF site (default: the profile's default one)",
                   short="p", sbatch="--partition", srun=True, bsub="-q"),
    ResourceOption("nodes", int, "nodes (default 1)", short="N", sbatch="--nodes", srun=True),
    ResourceOption("ntasks_per_node", int,
                   "processes per node (DDP: one per GPU, the default; launcher srun: Slurm tasks)",
                   sbatch="--ntasks-per-node"),
    ResourceOption("cpus", int, "CPUs per task", short="c", sbatch="--cpus-per-task", srun=True, bsub="-n"),
    ResourceOption("mem", str, "memory per node, e.g. 16G", sbatch="--mem", srun=True, bsub="-M"),
    ResourceOption("time", str, "time limit, e.g. 1:00:00 or 2-00:00:00",
                   short="t", sbatch="--time", srun=True, bsub="-W"),
    ResourceOption("account", str, "Slurm account to charge (on an LSF site: the project, bsub -P)",
                   short="A", sbatch="--account", srun=True, bsub="-P"),
    ResourceOption("qos", str, "quality of service", short="q", sbatch="--qos", srun=True),
    ResourceOption("array", str, "job array spec, e.g. 0-9%2", short="a", sbatch="--array"),
    ResourceOption("mail_user", str, "address Slurm mails about the job", sbatch="--mail-user", bsub="-u"),
    ResourceOption("mail_type", str, "what Slurm mails about (default END,FAIL with --mail-user)",
                   sbatch="--mail-type", bsub="-B -N"),
    ResourceOption("log", str,
                   "the job's log (sbatch --output), e.g. logs/%x-%j.out; patterns %j %x %u %A %a %%",
                   short="o", sbatch="--output", bsub="-o"),
    ResourceOption("error_log", str, "stderr's own log (sbatch --error; default: stderr goes to --log)",
                   short="e", sbatch="--error", bsub="-e"),
    ResourceOption("gpus", int, "GPUs per node", bsub="-gpu"),
    ResourceOption("gpu_type", str, "GPU model, in the site's spelling (e.g. a100, V100)"),
    ResourceOption("extra", tuple, "one more #SBATCH option, e.g. --extra=--exclusive (repeatable)"),
    ResourceOption("max_restarts", int,
                   "how often a job that checkpointed at its time limit requeues itself (default 10)"),
    ResourceOption("sync_every", str,
                   "how often the running job copies checkpoints and results to the shared run folder, so "
                   "that a node that dies loses at most that much, e.g. 30:00 (default 10:00; 0: only at "
                   "the end)", in_shell=False),
    ResourceOption("container", str, "apptainer or singularity (default: the profile's)"),
    ResourceOption("cleanenv", bool, "the container starts without the host's environment (--cleanenv)"),
    ResourceOption("no_home", bool, "the container does not mount your home directory (--no-home)"),
    ResourceOption("bind", tuple,
                   "one more bind into the container, /host or /host:/container[:ro] (repeatable)"),
    ResourceOption("home", str, "the home directory in the container, /host[:/container] (--home)"),
    ResourceOption("sif_on_scratch", bool, "each node copies the SIF to its local scratch and runs that "
                   "copy (default: the profile's [apptainer] sif_on_scratch)", in_shell=False),
    ResourceOption("unpack_sif", bool, "each node runs the SIF unpacked to its local scratch, for nodes that "
                   "cannot mount it (no FUSE); default: where the profile's [apptainer] fuse is false, and "
                   "where it is not known, where a node cannot mount it", in_shell=False),
)  # fmt: skip

BY_NAME = {option.name: option for option in RESOURCE_OPTIONS}


def named(kind: type) -> tuple[str, ...]:
    """The options of one kind, by name: the repeatable ones, the switches, the whole numbers."""
    return tuple(option.name for option in RESOURCE_OPTIONS if option.kind is kind)
