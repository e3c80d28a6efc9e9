"""`Executor` and `Job` with submitit's surface, over hpcbox's `Site`: a Python function runs inside the
project's environment SIF on any Slurm site reached over the user's own SSH.

A call travels as the job's dataset: a folder with the pickled function and arguments (one pickle per
array task) and `run_call.py`, staged on node scratch as any dataset is; the outcome comes back with
the job's results (`hpcbox fetch`). The job script is hpcbox's own, so node scratch, copy-back,
clean-up and the profile's resources are those of every hpcbox job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import json
import math
import operator
import pickle
import pickletools
import platform
import re
import shutil
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcbox import api
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import write_atomically
from hpcbox.project.command import ContainerCommand
from hpcbox.render.sweep import Sweep
from hpcbox.submitit import script_source
from hpcbox.submitit.script_source import GLOBALS, SCRIPT_DIR, ScriptSource

if TYPE_CHECKING:
    from hpcbox.jobs.watch import Watch
    from hpcbox.tools.slurm import JobState

try:  # submitit's own errors where it is installed, so that `except` clauses written for it hold
    from submitit.core.utils import FailedJobError, UncompletedJobError
except ImportError:  # pragma: no cover - the same names, for a caller without submitit

    class UncompletedJobError(RuntimeError):  # type: ignore[no-redef]
        """The job ended without a result: time limit, memory, cancel, node failure."""

    class FailedJobError(UncompletedJobError):  # type: ignore[no-redef]
        """The function raised; the message holds the remote traceback."""


RUNNER = Path(__file__).with_name("run_call.py")
# A Hydra job of hydra_plugins.hydra_hpcbox_launcher, run on the node by the runner, beside which it goes.
RUN_HYDRA_JOB = Path(__file__).with_name("run_hydra_job.py")
# What the job runs: the call's runner, from the staged call folder, one process.
CALL_COMMAND = ContainerCommand("script", "/scratch/data/run_call.py", ("{data_dir}", "{output_dir}"), "srun")

# A call that asks for no GPU runs in this flavour unless told otherwise (`Executor(flavour=...)`).
CPU_FLAVOUR = "cpu"
# What calls that need submitit (a script's `Checkpointable`, its `CommandFunction`) need on the node, sent
# from the laptop: pure Python, read by any Python 3, and last on the node's path, so that an
# environment with its own submitit uses that.
LAPTOP_PACKAGES = ("submitit", "cloudpickle", "typing_extensions")
LAPTOP_PACKAGES_DIR = "laptop-packages"

# submitit's generic parameters → hpcbox's resource options, and how a value becomes the option's.
GENERIC = {
    "timeout_min": ("time", lambda minutes: str(math.ceil(minutes))),  # Slurm reads "30" as minutes
    "mem_gb": ("mem", lambda gb: f"{math.ceil(gb * 1024)}M"),
    "cpus_per_task": ("cpus", int),
    "gpus_per_node": ("gpus", int),
    "nodes": ("nodes", int),
    "tasks_per_node": ("ntasks_per_node", int),
    "name": ("job_name", str),
}
# submitit's generic switch that hpcbox's jobs already do: stderr goes to the one log.
STDERR_TO_STDOUT = "stderr_to_stdout"
# How many of an array's tasks run at once (the sweep's throttle, `--array=0-99%N`): submitit's default.
ARRAY_PARALLELISM = "array_parallelism"
DEFAULT_ARRAY_PARALLELISM = 256
# submitit's SlurmExecutor parameters (`slurm_<name>`, the keywords of its `_make_sbatch_string`, v1.5.4),
# each honoured as an hpcbox option or refused with why; none is left out unsaid.
SLURM_AS_OPTION = {
    "partition": "partition", "account": "account", "qos": "qos", "job_name": "job_name",
    "mail_type": "mail_type", "mail_user": "mail_user", "nodes": "nodes",
    "ntasks_per_node": "ntasks_per_node",
    "cpus_per_task": "cpus", "gpus_per_node": "gpus", "num_gpus": "gpus", "mem": "mem", "time": "time",
    "max_num_timeout": "max_restarts", "array_parallelism": ARRAY_PARALLELISM,
    "stderr_to_stdout": STDERR_TO_STDOUT,
}  # fmt: skip
# Those that are one more sbatch option as they are (hpcbox's `extra`: `--name=value`).
SLURM_AS_SBATCH = (
    "comment", "constraint", "cpus_per_gpu", "dependency", "exclude", "exclusive", "gpus_per_task",
    "mem_per_cpu", "mem_per_gpu", "nodelist", "wckey",
)  # fmt: skip
_IN_THE_ENVIRONMENT = (
    "the call runs in the project's container, not in a shell of its own: what it needs goes into the "
    "environment (docker/, the project's dependencies)"
)
SLURM_REFUSED = {
    "setup": _IN_THE_ENVIRONMENT,
    "teardown": _IN_THE_ENVIRONMENT,
    "srun_args": "hpcbox starts the call with its own srun line",
    "signal_delay_s": "hpcbox's job script asks for the time limit's signal itself, a margin before it",
}
# `slurm_gres`, `slurm_additional_parameters` and `slurm_use_srun` are read by `_slurm_parameter`.
SLURM_NAMES = tuple(
    sorted({*SLURM_AS_OPTION, *SLURM_AS_SBATCH, *SLURM_REFUSED, "gres", "additional_parameters", "use_srun"})
)
VALID_PARAMETERS = tuple(
    sorted({
        *GENERIC, STDERR_TO_STDOUT, ARRAY_PARALLELISM, *api.site.RESOURCE_NAMES,
        *(f"slurm_{name}" for name in SLURM_NAMES),
    })
)  # fmt: skip
# Where a job's call folder says what it is: `Job(folder, job_id)` finds it there in another process.
JOB_FILE = "job.json"
# A script guards its own run, so that importing it on the node runs none of it.
_GUARDED = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)


@dataclass(frozen=True)
class JobPaths:
    """Where a job's files are here, as submitit names them: its call folder, the job script (the
    ledger's copy), the call's pickle, and once fetched its result and log (stderr goes to the same
    log)."""

    folder: Path
    submission_file: Path
    submitted_pickle: Path
    result_pickle: Path
    stdout: Path
    stderr: Path


@dataclass(frozen=True)
class Submission:
    """The call a job makes, as submitit's `DelayedSubmission` holds it."""

    function: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]


class Executor:
    """Runs Python functions as jobs on cluster ``cluster`` (a profile's name, `local` for the mini
    cluster), in the project's environment SIF with the project's code on `PYTHONPATH`.

    ``folder`` keeps each call's pickles here; ``site``: `hpcbox.Site`'s keywords (``via``, ``host``,
    ``user``, ``port``, ``mini_cluster``, ``remote_root``, ``project``, ``say``); ``flavour`` and
    ``offline`` are the environment image's (default: cpu for a call that asks for no GPU, else the
    flavour `hpcbox build` last made). Resources come from `update_parameters`, by submitit's generic
    names or hpcbox's own.

    A function defined in the project's code travels by reference (its module is imported on the node),
    and one defined at the top level of the running script or a notebook as its source (defined again
    on the node, the script's other statements not run: `script_source`), so the two Pythons may
    differ; a lambda or a nested function travels by value, which needs the same Python minor version on
    both sides: a mismatch is refused before anything is built or sent.

    On the node, files a call writes under `$HPCBOX_OUTPUT_DIR` come back with its result.

    Several clusters (``cluster="a,b"`` or a list), or several accounts (the ``account`` parameter,
    `"x,y"`), race as `hpcbox submit --cluster=a,b` does: each submission is sent to every one, the
    first job to start kept and the others cancelled; `submit` returns once one has started.
    """

    def __init__(
        self,
        folder: str | Path,
        cluster: str | Sequence[str] = "local",
        *,
        flavour: str | None = None,
        offline: bool = False,
        **site: Any,
    ) -> None:
        self.folder = Path(folder).expanduser().absolute()
        clusters = api.listed("cluster", cluster)
        logins = sorted(set(site) & {"host", "user", "port", "login"})
        if len(clusters) > 1 and logins:
            raise FieldError(logins[0], "a login goes with one cluster, not a race", "leave it out to race")
        self.sites = [api.Site(name, **{"on_line": _quiet, **site}) for name in clusters]
        self.site = self.sites[0]
        self.flavour, self.offline = flavour, offline
        self.parameters: dict[str, Any] = {}
        self._batch: list[tuple[Job, tuple[Callable[..., Any], tuple, dict]]] | None = None

    def update_parameters(self, **parameters: Any) -> None:
        """Resources for the next submissions: submitit's generic names (``timeout_min``, ``mem_gb``,
        ``cpus_per_task``, ``gpus_per_node``, ``nodes``, ``tasks_per_node``, ``name``) or hpcbox's
        (``partition``, ``account``, ``qos``, ``gpu_type``, ``time``, ...); a misspelt one is refused with
        the valid ones listed."""
        if self._batch is not None:
            raise HpcboxError(
                "parameters cannot change inside `with executor.batch():`", "set them before it"
            )
        given = hpcbox_resources(parameters)
        if given.get("extra") is not None and self.parameters.get("extra"):
            # An earlier call's sbatch options stay, but those given again, which the later replaces.
            again = {option.partition("=")[0] for option in given["extra"]}
            kept = [option for option in self.parameters["extra"] if option.partition("=")[0] not in again]
            given["extra"] = (*kept, *given["extra"])
        self.parameters.update(given)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
        """Run ``fn(*args, **kwargs)`` as a job; inside `batch()`, as a task of the batch's array."""
        if self._batch is not None:
            job = Job._of(None, None)
            self._batch.append((job, (fn, args, kwargs)))
            return job
        return self._submit_calls([(fn, args, kwargs)], array=False)[0]

    def map_array(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Job]:
        """``fn`` over the iterables' items (as the built-in `map`), as one array job: a task per call."""
        calls = [(fn, args, {}) for args in zip(*iterables, strict=False)]
        return self._submit_calls(calls, array=True) if calls else []

    def submit_array(self, fns: Sequence[Callable[[], Any]]) -> list[Job]:
        """Each of ``fns`` (no arguments) as a task of one array job."""
        return self._submit_calls([(fn, (), {}) for fn in fns], array=True) if fns else []

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Within the block, `submit` gathers its calls; at its end they go as one array job, and each
        job returned in the block is then that array's task."""
        if self._batch is not None:
            raise HpcboxError("`with executor.batch():` blocks do not nest", "end the first block first")
        self._batch = []
        try:
            yield
            gathered, self._batch = self._batch, None
            if gathered:
                submitted = self._submit_calls([call for _, call in gathered], array=True)
                for (job, _), made in zip(gathered, submitted, strict=True):
                    job._become(made)
        finally:
            self._batch = None

    def flavour_for(self, resources: dict[str, Any]) -> str | None:
        """The environment's flavour for calls asking ``resources``: the one given, else cpu for a call
        that asks for no GPU (as `hpcbox submit --offline` sends a CPU job: no 3 GB of CUDA for it),
        else None (the one `hpcbox build` last made, as for any job)."""
        if self.flavour is not None:
            return self.flavour
        asks_gpus = self.site.resources(resources, command=CALL_COMMAND, warn=False).gpus
        return None if asks_gpus else CPU_FLAVOUR

    def _submit_calls(
        self,
        calls: list[tuple[Callable[..., Any], tuple, dict]],
        *,
        array: bool,
        beside: Sequence[Path] = (),
        script_by_name: bool = False,
    ) -> list[Job]:
        """The calls as one job (an array of them with ``array``): pickled, checked, shipped, submitted;
        ``beside``: modules the calls import on the node, shipped beside the runner; ``script_by_name``:
        the running script's names travel by name (`pickle_call`'s ``script``). Bad input leaves
        nothing: no call folder, no job."""
        resources = dict(self.parameters)
        throttle = resources.pop(ARRAY_PARALLELISM, DEFAULT_ARRAY_PARALLELISM)
        accounts = api.listed("account", resources.get("account"))
        if len(accounts) > 1:  # raced: each entrant's own
            del resources["account"]
        if resources.get("nodes", 1) != 1 or resources.get("ntasks_per_node", 1) != 1:
            raise FieldError(
                "nodes" if resources.get("nodes", 1) != 1 else "tasks_per_node",
                "hpcbox.submitit runs a call as one process on one node",
                "leave out nodes and tasks_per_node (a function that starts its own processes may)",
            )
        project = self.site.project
        if script_by_name:
            script = script_module(project)  # once for all the calls
            by_name = [pickle_call(call, project, script=script) for call in calls]
            pickled = CallPickles(
                tuple(data for data, _ in by_name), any(by_value for _, by_value in by_name)
            )
        else:
            pickled = pickle_calls(calls, project)
        flavour = self.flavour_for(resources)
        refuse_missing_modules(pickled.modules - set(pickled.shipped), project, flavour)
        name = f"call-{uuid.uuid4().hex[:12]}"
        call_dir = self.folder / name
        call_dir.mkdir(parents=True)
        try:
            pickled.write(call_dir)
            for module in (RUNNER, *beside):
                shutil.copyfile(module, call_dir / module.name)
            points = tuple((str(i),) for i in range(len(calls)))
            sweep = Sweep("hpcbox.submitit", points, throttle) if array else None
            resources.setdefault("job_name", _job_name(calls[0][0]))
            submitted = self._send(
                () if array else ("0",), accounts, data=call_dir, flavour=flavour, offline=self.offline,
                sweep=sweep, command=CALL_COMMAND, **resources,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(call_dir, ignore_errors=True)
            raise
        shared = SubmittedCalls(submitted, call_dir)
        shared.save()
        return [Job._of(shared, index if array else None) for index in range(len(calls))]

    def _send(self, args: tuple[str, ...], accounts: list[str], **submitting: Any) -> api.Job:
        """The job sent to the site, or raced among the sites or ``accounts``: the one kept."""
        if len(self.sites) == 1 and len(accounts) < 2:
            job = self.site.submit(args, **submitting)
            assert job is not None  # not a dry run
            return job
        return api.race(api.entrants(self.sites, accounts), args, **submitting).kept


# The executor's settings (Executor's, and Site's through it), which no update_parameters changes.
EXECUTOR_SETTINGS = (
    "cluster", "flavour", "offline", "via", "host", "user", "port", "login", "mini_cluster", "remote_root",
    "cache", "project",
)  # fmt: skip


def hpcbox_resources(parameters: dict[str, Any]) -> dict[str, Any]:
    """submitit's parameters as hpcbox's resource options: its generic names, its SlurmExecutor's
    (`slurm_partition`...: each honoured or refused with why); hpcbox's own names pass as they are."""
    settled = sorted(set(parameters) & set(EXECUTOR_SETTINGS))
    if settled:
        raise FieldError(
            settled[0],
            "is the executor's own (where its jobs go, what they run in), given once as it is made",
            f"Executor(folder, {settled[0]}=...), or through submitit "
            f'AutoExecutor(folder, cluster="hpcbox", hpcbox_{settled[0]}=...)',
        )
    unknown = sorted(set(parameters) - set(VALID_PARAMETERS))
    if unknown:
        raise FieldError(unknown[0], f"no such parameter (a typo? allowed: {', '.join(VALID_PARAMETERS)})")
    resources: dict[str, Any] = {}
    for key, value in parameters.items():
        if key.startswith("slurm_"):
            for option, converted in _slurm_parameter(key, value):
                _set(resources, option, converted)
        elif key == STDERR_TO_STDOUT:
            _stderr_to_stdout(key, value)
        elif key == ARRAY_PARALLELISM:
            resources[key] = _array_parallelism(key, value)
        elif key in GENERIC and value is not None:
            option, convert = GENERIC[key]
            resources[option] = convert(value)
        else:
            _set(resources, key, value)
    return resources


def _set(resources: dict[str, Any], option: str, value: Any) -> None:
    """``option`` set to ``value``; `extra`'s sbatch options gather, from each name that gives some."""
    if option == "extra" and value is not None:
        value = (*resources.get("extra", ()), *((value,) if isinstance(value, str) else value))
    resources[option] = value


def _stderr_to_stdout(key: str, value: Any) -> None:
    if value is False:
        raise FieldError(key, "hpcbox's jobs write stderr to their one log", "leave it out, or True")


def _array_parallelism(key: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise FieldError(key, f"{value!r} must be a whole number of tasks, 1 or more")
    return value


def _slurm_parameter(key: str, value: Any) -> list[tuple[str, Any]]:
    """submitit's ``slurm_<name>`` as (hpcbox option, value) pairs; refused, naming it, where hpcbox
    cannot do what it asks."""
    name = key.removeprefix("slurm_")
    if name in SLURM_REFUSED:
        if value in (None, [], ()):
            return []  # submitit's own default: nothing asked
        raise FieldError(key, f"not taken by hpcbox.submitit: {SLURM_REFUSED[name]}", "leave it out")
    if value is None:
        return []
    if name == "use_srun":
        if value is not True:
            raise FieldError(key, "hpcbox starts every call with srun", "leave it out, or True")
        return []
    if name == "gres":
        return _gres(key, str(value))
    if name == "additional_parameters":
        if not isinstance(value, dict):
            raise FieldError(key, f"{value!r} is not a dict of sbatch options", "e.g. {'constraint': 'a100'}")
        asked = tuple(_sbatch_option(option, each) for option, each in value.items() if each is not False)
        return [("extra", asked)]
    if name in SLURM_AS_SBATCH:
        return [] if value is False else [("extra", _sbatch_option(name, value))]
    option = SLURM_AS_OPTION[name]
    if option == STDERR_TO_STDOUT:
        _stderr_to_stdout(key, value)
        return []
    if option == ARRAY_PARALLELISM:
        return [(option, _array_parallelism(key, value))]
    if name == "time" and isinstance(value, int | float):
        return [(option, str(math.ceil(value)))]  # submitit's minutes, as Slurm reads a bare number
    return [(option, value)]


def _sbatch_option(name: str, value: Any) -> str:
    """``name`` and ``value`` as sbatch's option, as submitit writes one (`--name=value`, `--name` for
    True)."""
    flag = "--" + name.replace("_", "-")
    return flag if value is True else f"{flag}={value}"


def _gres(key: str, gres: str) -> list[tuple[str, Any]]:
    """`gpu:2` or `gpu:a100:2` as hpcbox's gpus and gpu_type (the job script writes GPUs its own way);
    other generic resources as one more sbatch option."""
    found = re.fullmatch(r"gpu(?::([A-Za-z][\w.-]*))?:(\d+)", gres)
    if found is None:
        if "gpu" in gres:
            raise FieldError(key, f"{gres!r}: hpcbox takes GPUs as gpu:N or gpu:TYPE:N", "e.g. gpu:a100:2")
        return [("extra", f"--gres={gres}")]
    return [("gpus", int(found[2])), *((("gpu_type", found[1]),) if found[1] else ())]


def environment_python(project) -> str | None:
    """The environment's Python minor version (3.13), from the Debian pin of python3 in the image's
    lock (docker/lock/apt-system.txt), the Python every flavour's environment runs."""
    lock = project.root / project.docker_dir / "lock" / "apt-system.txt"
    if not lock.is_file():
        return None
    found = re.search(r"^python3=(\d+)\.(\d+)\.", lock.read_text(), re.MULTILINE)
    return f"{found[1]}.{found[2]}" if found else None


def refuse_missing_modules(modules: Iterable[str], project, flavour: str | None) -> None:
    """A module the calls import on the node that the environment lacks, named in one line before
    anything is built or sent, where the locks can tell: where pip installs every Python package of the
    flavour (its lock lists dependencies too). Debian's python3-* packages bring dependencies no lock
    lists, so beside them nothing is refused here: the node's ImportError comes back instead."""
    from hpcbox.build.image import FLAVOURS, last_image
    from hpcbox.project.depsource import debian_stand_ins

    own = {Path(item).stem for item in project.code}
    needed = sorted(set(modules) - set(sys.stdlib_module_names) - own - {"__main__"})
    for module in needed:
        local = _laptops_own(module)
        if local:
            raise HpcboxError(
                f"the call imports {module} on the node, a module of this machine's ({local}) that is "
                "not in the project's code, so the node does not have it",
                f"list its folder in tool.hpcbox.code ({', '.join(project.code) or 'none yet'})",
            )
    if flavour is None:
        try:
            flavour = last_image(project).flavour
        except HpcboxError:
            return  # not built yet: which flavour submit builds is its own to say
    chosen = FLAVOURS.get(flavour)
    docker = project.root / project.docker_dir
    if chosen is None or not (docker / chosen.pip_lock).is_file():
        return
    for lock in chosen.locks:
        debian = docker / lock
        python_packages = debian_stand_ins(debian) if lock != chosen.pip_lock and debian.is_file() else []
        if any(stand_in.package != "python3-venv" for stand_in in python_packages):
            return
    listed = {
        _canonical(found[1])
        for found in re.finditer(
            r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", (docker / chosen.pip_lock).read_text(), re.M
        )
    }
    for module in needed:
        distribution = distribution_of(module)
        if _canonical(module) not in listed and _canonical(distribution) not in listed:
            raise HpcboxError(
                f"the call imports {module} on the node, which the {flavour} environment lacks "
                f"({chosen.pip_lock} does not list {distribution})",
                f"add `{distribution}` to {_dependencies(project)}, then run `hpcbox lock`",
            )


def distribution_of(module: str) -> str:
    """The package that installs ``module`` here (sklearn: scikit-learn), else the module's name."""
    from importlib.metadata import packages_distributions

    return (packages_distributions().get(module) or [module])[0]


def _laptops_own(module: str) -> str | None:
    """Where ``module`` is found here when no installed package provides it (a file beside the
    script), else None."""
    import importlib.util
    from importlib.metadata import packages_distributions

    if module in packages_distributions():
        return None
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = found.origin if found else None
    return origin if origin and origin not in ("built-in", "frozen") else None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dependencies(project) -> str:
    from hpcbox.project.depsource import detect

    found = detect(project.root)
    return found.path.name if found else "the project's dependencies (a requirements.txt)"


def missing_module_hint(module: str, project) -> str:
    """What to do where the node could not import ``module``."""
    return (
        f"hint: the environment lacks {module}: add `{distribution_of(module)}` to {_dependencies(project)}, "
        "then run `hpcbox lock` and submit again"
    )


def pickle_call(
    call: tuple[Callable[..., Any], tuple, dict], project, *, script: str | None = None
) -> tuple[bytes, bool]:
    """The call pickled, and whether it travels by value (a function of `__main__`, a lambda, a local
    function: cloudpickle sends its code, which only the same Python minor version reads). By value
    across Python versions is refused here, in one line, before anything is built or sent.

    With ``script`` (the running script's module name on the node, `script_module`'s), its functions
    and classes travel by name instead: the node imports the script as a module. For a script whose
    imports the environment has, as a Hydra application's (a script that imports hpcbox would fail to
    import there)."""
    try:
        plain = _pickle_by_reference(call, script)
        by_value = _names_main(plain)
    except (pickle.PicklingError, AttributeError, TypeError):
        by_value = True
    if not by_value:
        return plain, False
    return by_value_on_the_same_python(
        [call], project, call[0], "defined in a script, a notebook or a function"
    )[0], True


def by_value_on_the_same_python(calls: list[tuple], project, what: Any, why: str) -> list[bytes]:
    """The calls as cloudpickle sends them (code and all), which only the same Python minor version
    reads: refused in one line, naming ``what`` travels so (``why``), where the environment's differs."""
    import cloudpickle

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    there = environment_python(project)
    if there != here:
        name = getattr(what, "__qualname__", repr(what))
        environment = f"the environment's is {there}" if there else "the environment's is not pinned"
        raise HpcboxError(
            f"{name} travels by value ({why}), which needs the same Python on both sides: this is "
            f"{platform.python_version()}, {environment}",
            f"define it with `def` at the top level of the script, or in the project's code "
            f"({', '.join(project.code) or 'tool.hpcbox.code'}), passing what it used as arguments; or call "
            f"it from Python {there or 'the environment runs'}",
        )
    return [cloudpickle.dumps(call, protocol=4) for call in calls]


@dataclass(frozen=True)
class CallPickles:
    """A job's calls as they travel: a pickle each, and where they name the running script's functions
    and classes, its definitions (source) and the values its code reads (data)."""

    pickles: tuple[bytes, ...]
    by_value: bool  # by cloudpickle: the same Python on both sides
    script: ScriptSource | None = None
    script_globals: bytes = b""
    modules: frozenset[str] = frozenset()  # the top-level modules the node imports for them

    @property
    def shipped(self) -> tuple[str, ...]:
        """The laptop's packages that go with the calls: submitit's, where they need it."""
        return LAPTOP_PACKAGES if "submitit" in self.modules else ()

    def write(self, call_dir: Path) -> None:
        """Into the call's folder (the job's dataset), as run_call.py reads them."""
        for index, pickled in enumerate(self.pickles):
            (call_dir / f"call-{index}.pkl").write_bytes(pickled)
        if self.by_value:
            import cloudpickle

            shutil.copytree(Path(cloudpickle.__file__).parent, call_dir / "cloudpickle")
        # A call of submitit's own (its CommandFunction) needs them as much as a script's Checkpointable.
        for module in self.shipped:
            found = importlib.import_module(module)
            folder = Path(found.__file__ or "")
            if folder.name == "__init__.py":
                shutil.copytree(folder.parent, call_dir / LAPTOP_PACKAGES_DIR / module)
            else:
                (call_dir / LAPTOP_PACKAGES_DIR).mkdir(exist_ok=True)
                shutil.copyfile(folder, call_dir / LAPTOP_PACKAGES_DIR / folder.name)
        if self.script is None:
            return
        (call_dir / SCRIPT_DIR).mkdir()
        (call_dir / SCRIPT_DIR / self.script.file_name).write_text(self.script.text)
        (call_dir / SCRIPT_DIR / GLOBALS).write_bytes(self.script_globals)


def pickle_calls(calls: list[tuple[Callable[..., Any], tuple, dict]], project) -> CallPickles:
    """The calls pickled: a function or class of the project's code (or any importable module) by
    reference; one of the running script or notebook by reference to its source, which travels with
    them; its arguments and the values its code reads as data. What has no source of its own at the
    top level (a lambda, a nested function, a closure) travels by value, to the same Python only."""
    try:
        pickled = [script_source.dumps(call) for call in calls]
    except script_source.NoSource as missing:
        return CallPickles(
            tuple(by_value_on_the_same_python(calls, project, missing.obj, _kind(missing.obj))), True
        )
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        return CallPickles(tuple(by_value_on_the_same_python(calls, project, calls[0][0], str(error))), True)
    main = set().union(*(each.main_names for each in pickled))
    modules = set().union(*(each.modules for each in pickled))
    data = tuple(each.data for each in pickled)
    if not main:
        return CallPickles(data, False, modules=frozenset(modules))
    script = script_source.running_script()
    if script is None:
        why = "defined where there is no source file to send: `python -c`, a prompt"
        return CallPickles(tuple(by_value_on_the_same_python(calls, project, calls[0][0], why)), True)
    namespace = vars(sys.modules["__main__"])
    values = {}
    for name in script.data_names(namespace):
        try:
            values[name] = script_source.dumps(namespace[name])
        except script_source.NoSource as missing:
            raise _refused_global(script, name, _kind(missing.obj)) from None
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            raise _refused_global(script, name, f"it cannot be pickled: {error}") from None
    for each in values.values():
        main |= each.main_names
        modules |= each.modules
    undefined = sorted(main - script.defined)
    if undefined:
        raise HpcboxError(
            f"{undefined[0]} ({script.where(undefined[0])}) is defined inside a block that does not run on "
            'the node: only the script\'s top level and its `if __name__ == "__main__":` block are',
            "define it at the top level of the script",
        )
    script_globals = pickle.dumps({name: each.data for name, each in values.items()}, protocol=4)
    return CallPickles(data, False, script, script_globals, frozenset(modules | set(script.imports)))


def _kind(obj: Any) -> str:
    """What has no source of its own at a script's top level, in a user's words."""
    if getattr(obj, "__name__", "") == "<lambda>":
        return "a lambda"
    if isinstance(obj, type):
        return "a class defined inside a function"
    return (
        "a closure over a function's local state"
        if getattr(obj, "__closure__", None)
        else "a nested function"
    )


def _refused_global(script: ScriptSource, name: str, why: str) -> HpcboxError:
    return HpcboxError(
        f"{name} ({script.where(name)}) is set by code that does not run on the node, and the script's "
        f"functions read it, but its value cannot travel: {why}",
        "pass it to the call as an argument, or set it inside the function that reads it",
    )


def script_module(project) -> str | None:
    """The running script (`__main__`) as the node imports it: its module name under the code snapshot
    (`/code`, on `PYTHONPATH`), where the project's code ships it and it guards its own run; else None
    (a notebook, an interpreter, a script outside the project's code)."""
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not file or not file.endswith(".py"):
        return None
    script = Path(file).resolve()
    for item in project.code:
        shipped = (project.root / item).resolve()  # shipped as /code/<its last part>
        if script == shipped:
            name = script.stem
        elif shipped.is_dir() and script.is_relative_to(shipped):
            name = ".".join((shipped.name, *script.relative_to(shipped).with_suffix("").parts))
        else:
            continue
        guarded = _GUARDED.search(script.read_text(errors="replace")) is not None
        return name if guarded and all(part.isidentifier() for part in name.split(".")) else None
    return None


class NodeFunction:
    """A function of a module that travels beside the runner (not importable here under that name),
    pickled as its name there."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.__name__ = module, name

    def __reduce__(self) -> tuple:
        return operator.attrgetter(self.__name__), (_ModuleOnNode(self.module),)


class _ModuleOnNode:
    """A module, pickled as its import on the node."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple:
        return importlib.import_module, (self.name,)


class _ScriptAsModule(pickle.Pickler):
    """A pickler that writes the running script's functions and classes as names in ``module``."""

    def __init__(self, file: io.BytesIO, module: str) -> None:
        super().__init__(file, protocol=4)
        self.module = module

    def reducer_override(self, obj: Any) -> Any:
        # Classes and functions only: other objects' attributes may be anything (a config's keys).
        if not isinstance(obj, type | types.FunctionType) or obj.__module__ != "__main__":
            return NotImplemented
        if "<" in obj.__qualname__:  # a lambda or a local: not a name in the script
            return NotImplemented
        return operator.attrgetter(obj.__qualname__), (_ModuleOnNode(self.module),)


def _pickle_by_reference(call: tuple, module: str | None) -> bytes:
    """Plain pickle, with the running script's names as names in ``module`` where it has one."""
    if module is None:
        return pickle.dumps(call, protocol=4)
    written = io.BytesIO()
    _ScriptAsModule(written, module).dump(call)
    return written.getvalue()


def _names_main(pickled: bytes) -> bool:
    """Whether a plain pickle refers to a name in `__main__` (which the node's `__main__` lacks)."""
    strings: list[str] = []
    for opcode, argument, _ in pickletools.genops(pickled):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(argument)
            continue
        module = strings[-2] if opcode.name == "STACK_GLOBAL" and len(strings) >= 2 else None
        if opcode.name == "GLOBAL":
            module = str(argument).split(" ")[0]
        if module == "__main__":
            return True
    return False


def _job_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", type(fn).__name__)
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64] or "call"


class SubmittedCalls:
    """One job of calls (an array of them, or a single one), which its tasks' `Job`s share: its site's
    watch (`hpcbox.Site.watch`: every job of the site this process waits on, in one look a poll, less
    often the longer the wait, a task seen ended never asked about again) and the results fetched, so
    that a thousand tasks waited on one after another, or in `helpers.as_completed`'s rounds, cost one
    look at Slurm per poll of the watch and a fetch per batch of tasks found ended, not one each.

    ``job`` is the `hpcbox.Job` Slurm runs (an array's: its tasks by `task(i)`); ``call_dir`` the call's
    folder here, where `job.json` lets a later process find the job again (`Job(folder, job_id)`)."""

    def __init__(self, job: api.Job, call_dir: Path) -> None:
        self.job, self.call_dir = job, call_dir
        self.array = job.record.is_array
        self._fetched: set[int | None] = set()  # whose results, complete, are here
        self._fetched_folder: Path | None = None

    @functools.cached_property
    def watch(self) -> Watch:
        return self.job.watch

    def key(self, task: int | None) -> str:
        """The task's id as Slurm and the watch name it: `1234`, or `1234_5`."""
        return self.job.job_id if task is None else f"{self.job.job_id}_{task}"

    def save(self) -> None:
        """`job.json` in the call's folder: the job's record and how its site is reached."""
        site = self.job.site
        project = site.project
        login = site.login and {
            name: str(value) if isinstance(value, Path) else value
            for name, value in dataclasses.asdict(site.login).items()
        }
        found = {
            "record": json.loads(self.job.record.to_json()),
            "site": {
                "name": site.name, **dataclasses.asdict(site.place), "login": login,
                "mini_cluster": site.mini_cluster, "remote_root": site.remote_root,
                "cache": site.cache and str(site.cache),
            },
            "project": {
                "root": str(project.root), "ledger_dir": project.ledger_dir and str(project.ledger_dir),
                "results_dir": project.results_dir and str(project.results_dir),
            },
        }  # fmt: skip
        write_atomically(self.call_dir / JOB_FILE, json.dumps(found, indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, call_dir: Path) -> SubmittedCalls:
        """The job ``call_dir``'s `job.json` names, reached as it was submitted."""
        from hpcbox.ledger import JobRecord
        from hpcbox.project.config import load_project
        from hpcbox.tools.ssh import Target

        found = json.loads((call_dir / JOB_FILE).read_text())
        paths = {name: Path(value) if value else None for name, value in found["project"].items()}
        project = dataclasses.replace(
            load_project(paths["root"]), ledger_dir=paths["ledger_dir"], results_dir=paths["results_dir"]
        )
        site_args = dict(found["site"])
        login = site_args.pop("login")
        if login is not None:
            login = Target(**{
                name: Path(value) if name in ("key_path", "known_hosts") and value else value
                for name, value in login.items()
            })  # fmt: skip
        site = api.Site(site_args.pop("name"), **site_args, login=login, project=project, on_line=_quiet)
        record = JobRecord.from_json(json.dumps(found["record"]))
        return cls(api.Job(site, record), call_dir)

    def task_job(self, task: int | None) -> api.Job:
        return self.job if task is None else self.job.task(task)

    def state(self, task: int | None) -> JobState:
        """The task's state (None: the job's), as the watch last saw it where a look is not yet due."""
        return self.watch.state(self.key(task))

    def final_state(self, task: int | None) -> JobState:
        """The ended task's state from Slurm, with why where it says more than its state (a kill for
        memory)."""
        return self.task_job(task).state()

    def wait(self, task: int | None) -> JobState:
        """Until the task (None: the job) has ended, however long, looking as the watch's schedule says
        (every FIRST_POLL_S at first, up to a minute, as submitit's watcher backs off)."""
        return self.watch.wait(self.key(task))

    def results_folder(self, task: int | None) -> Path | None:
        """Once the task (None: the job) has ended, the job's fetched results, or None where it copied
        nothing back. One fetch brings every task that had ended before it."""
        from hpcbox.jobs.fetch import NoResults

        self.wait(task)
        if task not in self._fetched:
            # complete on the cluster before the fetch begins
            tasks = range(len(self.job.record.sweep)) if self.array else (None,)
            ended = {each for each in tasks if self.watch.ended(self.key(each))}
            try:
                self._fetched_folder = self.job.fetch()
            except NoResults:
                return None
            self._fetched |= ended
        return self._fetched_folder

    def cancel(self, task: int | None) -> None:
        self.task_job(task).cancel()
        self.watch.forget(self.key(task))  # read again: cancelled, or ended before


class Job:
    """A call submitted by `Executor`: submitit's `Job` (``job_id``, ``state``, ``done``, ``result``,
    ``results``, ``exception``, ``wait``, ``cancel``, ``stdout``, ``stderr``, ``paths``, ``submission``,
    ``cancel_at_deletion``). An array's task is a job of its own: each of these acts on that task alone.

    ``Job(folder, job_id)`` finds a job again from the executor's ``folder`` (its call folder holds
    what it takes), in another process, a day later; a job pickles as just that."""

    def __init__(self, folder: str | Path, job_id: str) -> None:
        base, _, task = str(job_id).partition("_")
        calls = SubmittedCalls.load(_call_dir(Path(folder).expanduser().absolute(), base))
        if task and not (task.isdigit() and 0 <= int(task) < len(calls.job.record.sweep)):
            raise HpcboxError(
                f"job {job_id}: job {base} has tasks 0-{len(calls.job.record.sweep) - 1}",
                f"name one as {base}_N",
            )
        if calls.array and not task:
            raise HpcboxError(f"job {base} is an array job", f"name one of its tasks: {base}_0, {base}_1...")
        self._bind(calls, int(task) if task else None)

    @classmethod
    def _of(cls, calls: SubmittedCalls | None, task: int | None) -> Job:
        job = cls.__new__(cls)
        job._bind(calls, task)
        return job

    def _bind(self, calls: SubmittedCalls | None, task: int | None) -> None:
        self._calls, self.task_id = calls, task
        self._cancel_at_deletion = False

    def _become(self, other: Job) -> None:
        self._calls, self.task_id = other._calls, other.task_id

    def __reduce__(self) -> tuple:
        calls = self._call
        return Job, (str(calls.call_dir.parent), self.job_id)

    @property
    def _call(self) -> SubmittedCalls:
        if self._calls is None:
            raise HpcboxError("this job is submitted at the end of its `with executor.batch():` block")
        return self._calls

    @property
    def job_id(self) -> str:
        """Slurm's id: `1234`, or `1234_5` for an array's task."""
        job_id = self._call.job.job_id
        return job_id if self.task_id is None else f"{job_id}_{self.task_id}"

    def __repr__(self) -> str:
        return f"Job<{self._call.job.record.where}: {self.job_id}>" if self._calls else "Job<in a batch>"

    @property
    def state(self) -> str:
        """Slurm's state of this job (an array's task: its own): PENDING, RUNNING, COMPLETED, FAILED,
        TIMEOUT, CANCELLED, ..."""
        return self._call.state(self.task_id).state

    def done(self) -> bool:
        return self._call.state(self.task_id).finished

    def wait(self) -> None:
        """Until this job (an array's task: that task) has ended, however long it takes."""
        self._call.wait(self.task_id)

    def cancel(self) -> None:
        """Cancel this job (an array's task: that task alone), letting it copy back what it wrote."""
        self._call.cancel(self.task_id)

    def cancel_at_deletion(self, value: bool = True) -> Job:
        """Whether this job is cancelled when this object is deleted (as submitit's: off unless asked),
        where it has not ended."""
        self._cancel_at_deletion = value
        return self

    def __del__(self) -> None:
        if getattr(self, "_cancel_at_deletion", False) and self._calls is not None:
            with contextlib.suppress(HpcboxError):
                if not self.done():
                    self.cancel()

    @property
    def paths(self) -> JobPaths:
        """Where its files are here, as submitit names them (its result and log once fetched)."""
        from hpcbox.jobs.fetch import local_run_dir

        call = self._call
        record = call.job.record
        local = local_run_dir(call.job.site.project, record)  # where fetch puts them
        results = local / str(self.task_id) if self.task_id is not None else local
        # An array's log names its task `*` in the ledger (each task writes its own).
        log = local / Path(record.log).name.replace("*", str(self.task_id))
        ledger = call.job.site.project.jobs_dir / f"{record.where}-{record.run}.sh"  # the ledger's copy
        submitted = call.call_dir / f"call-{self.task_id or 0}.pkl"
        return JobPaths(call.call_dir, ledger, submitted, results / "result.pkl", log, log)

    def submission(self) -> Submission:
        """The call this job makes (``function``, ``args``, ``kwargs``), as submitit's `submission()`
        returns it: read back from its pickle, in this process (a function of the running script is
        its name in `__main__`)."""
        function, args, kwargs = pickle.loads(self.paths.submitted_pickle.read_bytes())
        return Submission(function, args, kwargs)

    def _outcome(self) -> tuple:
        call = self._call
        folder = call.results_folder(self.task_id)
        found = self.paths.result_pickle
        if folder is None or not found.is_file():
            final = call.final_state(self.task_id)
            note = f" ({final.note})" if final.note else ""
            tail = "\n".join((self.stdout() or "").splitlines()[-15:])
            raise UncompletedJobError(
                f"job {self.job_id} ended {final.state}{note} without a result; its log's last lines:\n{tail}"
            )
        return pickle.loads(found.read_bytes())

    def result(self) -> Any:
        """What the function returned, once this job has ended; FailedJobError (with the remote
        traceback) where it raised, UncompletedJobError (naming how it ended) where it left no result."""
        outcome = self._outcome()
        if outcome[0] == "success":
            return outcome[1]
        _, error, trace, missing_module = outcome
        hint = (
            f"\n{missing_module_hint(missing_module, self._call.job.site.project)}" if missing_module else ""
        )
        raise FailedJobError(f"job {self.job_id} failed: {error}\nits traceback there:\n{trace}{hint}")

    def results(self) -> list[Any]:
        return [self.result()]

    def exception(self) -> UncompletedJobError | None:
        """The error `result` would raise, or None."""
        try:
            self.result()
        except UncompletedJobError as error:
            return error
        return None

    def stdout(self) -> str | None:
        """Its log (stdout and stderr; an array's task: its own): read on the cluster while it runs, the
        fetched copy once it has ended; None before it wrote one."""
        call = self._call
        if not call.state(self.task_id).finished:
            return call.task_job(self.task_id).log_text()
        call.results_folder(self.task_id)
        log = self.paths.stdout
        return log.read_text(errors="replace") if log.is_file() else None

    def stderr(self) -> str | None:
        return self.stdout()


def _call_dir(folder: Path, job_id: str) -> Path:
    """The call folder under the executor's ``folder`` (or ``folder`` itself) whose job is ``job_id``:
    the last submitted, where a cluster gave the id again."""
    found = []
    for candidate in (folder, *sorted(folder.glob("call-*"))):
        saved = candidate / JOB_FILE
        if saved.is_file():
            record = json.loads(saved.read_text())["record"]
            if record["job_id"] == job_id:
                found.append((record["submitted_at"], candidate))
    if not found:
        raise HpcboxError(
            f"job {job_id}: no call folder in {folder} is that job's",
            "give the folder the executor was made with (`Executor(folder, ...)`), and Slurm's job id",
        )
    return max(found)[1]


def _quiet(_: str) -> None:
    """A build's own output, not shown: the call's progress lines say what happens."""
