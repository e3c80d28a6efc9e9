"""`Executor` and `Job` with submitit's surface, over hpcbox's `Site`: a Python function runs inside the
project's environment SIF on any Slurm site reached over the user's own SSH.

A call travels as the job's dataset: a folder with the pickled function and arguments (one pickle per
array task) and `run_call.py`, staged on node scratch as any dataset is; the outcome comes back with
the job's results (`hpcbox fetch`). The job script is hpcbox's own, so node scratch, copy-back,
clean-up and the profile's resources are those of every hpcbox job.
"""

from __future__ import annotations

import contextlib
import importlib
import io
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
from typing import Any

from hpcbox import api
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.project.command import ContainerCommand
from hpcbox.render.sweep import Sweep

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
# How many of an array's tasks run at once (the sweep's throttle, `--array=0-99%N`).
ARRAY_PARALLELISM = "array_parallelism"
VALID_PARAMETERS = tuple(sorted({*GENERIC, STDERR_TO_STDOUT, ARRAY_PARALLELISM, *api.site.RESOURCE_NAMES}))
# A script guards its own run, so that importing it on the node runs none of it.
_GUARDED = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)


@dataclass(frozen=True)
class JobPaths:
    """Where a job's files are here, as submitit names them: the call's pickle, and once fetched its
    result and log (the job's stderr goes to the same log)."""

    submitted_pickle: Path
    result_pickle: Path
    stdout: Path
    stderr: Path


class Executor:
    """Runs Python functions as jobs on cluster ``cluster`` (a profile's name, `local` for the mini
    cluster), in the project's environment SIF with the project's code on `PYTHONPATH`.

    ``folder`` keeps each call's pickles here; ``site``: `hpcbox.Site`'s keywords (``via``, ``host``,
    ``user``, ``port``, ``mini_cluster``, ``remote_root``, ``project``, ``say``); ``flavour`` and
    ``offline`` are the environment image's (default: the flavour `hpcbox build` last made). Resources
    come from `update_parameters`, by submitit's generic names or hpcbox's own.

    A function defined in the project's code travels by reference (its module is imported on the node),
    so the two Pythons may differ; one defined in a script or a notebook (`__main__`) travels by value,
    which needs the same Python minor version on both sides: a mismatch is refused before anything is
    built or sent.

    On the node, files a call writes under `$HPCBOX_OUTPUT_DIR` come back with its result.
    """

    def __init__(
        self,
        folder: str | Path,
        cluster: str = "local",
        *,
        flavour: str | None = None,
        offline: bool = False,
        **site: Any,
    ) -> None:
        self.folder = Path(folder).expanduser().absolute()
        self.site = api.Site(cluster, **{"on_line": lambda _: None, **site})
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
        self.parameters.update(hpcbox_resources(parameters))

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
        """Run ``fn(*args, **kwargs)`` as a job; inside `batch()`, as a task of the batch's array."""
        if self._batch is not None:
            job = Job(self, None, None)
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
        throttle = resources.pop(ARRAY_PARALLELISM, None)
        if resources.get("nodes", 1) != 1 or resources.get("ntasks_per_node", 1) != 1:
            raise FieldError(
                "nodes" if resources.get("nodes", 1) != 1 else "tasks_per_node",
                "hpcbox.submitit runs a call as one process on one node",
                "leave out nodes and tasks_per_node (a function that starts its own processes may)",
            )
        script = script_module(self.site.project) if script_by_name else None  # once for all the calls
        pickles = [pickle_call(call, self.site.project, script=script) for call in calls]
        by_value = any(travels_by_value for _, travels_by_value in pickles)
        name = f"call-{uuid.uuid4().hex[:12]}"
        call_dir = self.folder / name
        call_dir.mkdir(parents=True)
        try:
            for index, (pickled, _) in enumerate(pickles):
                (call_dir / f"call-{index}.pkl").write_bytes(pickled)
            for module in (RUNNER, *beside):
                shutil.copyfile(module, call_dir / module.name)
            if by_value:
                import cloudpickle

                shutil.copytree(Path(cloudpickle.__file__).parent, call_dir / "cloudpickle")
            points = tuple((str(i),) for i in range(len(calls)))
            sweep = Sweep("hpcbox.submitit", points, throttle) if array else None
            resources.setdefault("job_name", _job_name(calls[0][0]))
            submitted = self.site.submit(
                () if array else ("0",), data=call_dir, flavour=self.flavour, offline=self.offline,
                sweep=sweep, command=CALL_COMMAND, **resources,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(call_dir, ignore_errors=True)
            raise
        assert submitted is not None  # not a dry run
        shared = _Submitted(submitted, call_dir, array)
        return [Job(self, shared, index if array else None) for index in range(len(calls))]


def hpcbox_resources(parameters: dict[str, Any]) -> dict[str, Any]:
    """submitit's parameters as hpcbox's resource options; hpcbox's own names pass as they are."""
    unknown = sorted(set(parameters) - set(VALID_PARAMETERS))
    if unknown:
        raise FieldError(unknown[0], f"no such parameter (a typo? allowed: {', '.join(VALID_PARAMETERS)})")
    resources: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == STDERR_TO_STDOUT:
            if value is False:
                raise FieldError(key, "hpcbox's jobs write stderr to their one log", "leave it out, or True")
        elif key == ARRAY_PARALLELISM:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise FieldError(key, f"{value!r} must be a whole number of tasks, 1 or more")
            resources[key] = value
        elif key in GENERIC and value is not None:
            option, convert = GENERIC[key]
            resources[option] = convert(value)
        else:
            resources[key] = value
    return resources


def environment_python(project) -> str | None:
    """The environment's Python minor version (3.13), from the Debian pin of python3 in the image's
    lock (docker/lock/apt-system.txt), the Python every flavour's environment runs."""
    lock = project.root / project.docker_dir / "lock" / "apt-system.txt"
    if not lock.is_file():
        return None
    found = re.search(r"^python3=(\d+)\.(\d+)\.", lock.read_text(), re.MULTILINE)
    return f"{found[1]}.{found[2]}" if found else None


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
    import cloudpickle

    fn = call[0]
    try:
        plain = _pickle_by_reference(call, script)
        by_value = _names_main(plain)
    except (pickle.PicklingError, AttributeError, TypeError):
        by_value = True
    if not by_value:
        return plain, False
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    there = environment_python(project)
    if there != here:
        what = getattr(fn, "__qualname__", repr(fn))
        environment = f"the environment's is {there}" if there else "the environment's is not pinned"
        raise HpcboxError(
            f"{what} travels by value (defined in a script, a notebook or a function), which needs the same "
            f"Python on both sides: this is {platform.python_version()}, {environment}",
            f"define it in the project's code ({', '.join(project.code) or 'tool.hpcbox.code'}), so that it "
            f"travels by reference, or call it from Python {there or 'the environment runs'}",
        )
    return cloudpickle.dumps(call, protocol=4), True


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


class _Submitted:
    """One job of calls (an array of them or a single one), shared by its tasks' `Job`s: its state read
    once for all, its results fetched once for all."""

    def __init__(self, job: api.Job, call_dir: Path, array: bool) -> None:
        self.job, self.call_dir, self.array = job, call_dir, array
        self.fetched: Path | None = None
        self.final = None

    def wait(self):
        if self.final is None:
            self.final = self.job.wait()
        return self.final

    def results_folder(self) -> Path | None:
        """The job's fetched results (once it ended), or None where it copied nothing back."""
        from hpcbox.jobs.fetch import NoResults

        self.wait()
        if self.fetched is None:
            try:
                self.fetched = self.job.fetch()
            except NoResults:
                return None
        return self.fetched


class Job:
    """A call submitted by `Executor`: submitit's `Job` (``job_id``, ``state``, ``done``, ``result``,
    ``results``, ``exception``, ``wait``, ``cancel``, ``stdout``, ``stderr``, ``paths``)."""

    def __init__(self, executor: Executor, submitted: _Submitted | None, task: int | None) -> None:
        self._executor, self._submitted, self.task_id = executor, submitted, task

    def _become(self, other: Job) -> None:
        self._submitted, self.task_id = other._submitted, other.task_id

    @property
    def _call(self) -> _Submitted:
        if self._submitted is None:
            raise HpcboxError("this job is submitted at the end of its `with executor.batch():` block")
        return self._submitted

    @property
    def job_id(self) -> str:
        """Slurm's id: `1234`, or `1234_5` for an array's task."""
        job_id = self._call.job.job_id
        return job_id if self.task_id is None else f"{job_id}_{self.task_id}"

    def __repr__(self) -> str:
        return f"Job<{self._call.job.record.where}: {self.job_id}>" if self._submitted else "Job<in a batch>"

    @property
    def state(self) -> str:
        """Slurm's state: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, ..."""
        call = self._call
        if call.final is not None:
            return self._task_state(call.final) if self.task_id is not None else call.final.state
        if self.task_id is None:
            return call.job.state().state
        found = call.job.task_states().get(self.task_id)
        return found.state if found else "PENDING"

    def _task_state(self, final) -> str:
        found = self._call.job.task_states().get(self.task_id)
        return found.state if found else final.state

    def done(self) -> bool:
        from hpcbox.tools.slurm import FINISHED_STATES

        return self.state in FINISHED_STATES

    def wait(self) -> None:
        """Until the job (an array: all its tasks) has ended."""
        self._call.wait()

    def cancel(self) -> None:
        """Cancel the job (an array: every task), letting it copy back what it wrote."""
        self._call.job.cancel()

    @property
    def paths(self) -> JobPaths:
        from hpcbox.jobs.fetch import local_run_dir

        call = self._call
        index = self.task_id or 0
        local = local_run_dir(call.job.site.project, call.job.record)  # where fetch puts them
        results = local / str(self.task_id) if self.task_id is not None else local
        # An array's log names its task `*` in the ledger (each task writes its own).
        log = local / Path(call.job.record.log).name.replace("*", str(self.task_id))
        return JobPaths(call.call_dir / f"call-{index}.pkl", results / "result.pkl", log, log)

    def _outcome(self) -> tuple:
        call = self._call
        final = call.wait()
        folder = call.results_folder()
        found = self.paths.result_pickle
        if folder is None or not found.is_file():
            state = self._task_state(final) if self.task_id is not None else final.state
            note = f" ({final.note})" if final.note else ""
            tail = "\n".join((self.stdout() or "").splitlines()[-15:])
            raise UncompletedJobError(
                f"job {self.job_id} ended {state}{note} without a result; its log's last lines:\n{tail}"
            )
        return pickle.loads(found.read_bytes())

    def result(self) -> Any:
        """What the function returned, once the job has ended; FailedJobError (with the remote
        traceback) where it raised, UncompletedJobError (naming how it ended) where it left no result."""
        outcome = self._outcome()
        if outcome[0] == "success":
            return outcome[1]
        raise FailedJobError(f"job {self.job_id} failed: {outcome[1]}\nits traceback there:\n{outcome[2]}")

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
        """The job's log (stdout and stderr), as fetched; None before it wrote one."""
        self._call.results_folder()
        log = self.paths.stdout
        return log.read_text(errors="replace") if log.is_file() else None

    def stderr(self) -> str | None:
        return self.stdout()
