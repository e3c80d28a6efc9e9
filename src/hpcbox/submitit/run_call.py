"""One call of hpcbox.submitit, run by the job inside the project's container: `python run_call.py
DATA_DIR OUTPUT_DIR INDEX`. It unpickles call-INDEX.pkl (the function, its arguments) from the job's
staged data, calls it, and pickles the outcome to OUTPUT_DIR/result.pkl, which the job script copies
back beside the job's other results (and whatever the call wrote under `$HPCBOX_OUTPUT_DIR`). Standard
library only: the environment is the project's, and the caller's cloudpickle travels beside the pickle
where a function travels by value.

Where the call names the laptop's running script (its functions and classes, by name in `__main__`),
the script's definitions come along as source (script/<name>.py: its imports, defs, classes and
constants, nothing that runs): they become this process's `__main__`, as the script was the laptop's,
and the values their code reads that other statements set (script/globals.pkl) are put in it. Where
the calls need submitit (a script's Checkpointable, submitit's CommandFunction), the laptop's submitit
comes along (laptop-packages/), last on the path.
What fails there (a module the environment lacks, say) is the call's error, as what the call raises.

At the time limit's signal (USR1, which the job script passes on), a callable with
`__submitit_checkpoint__` (or `checkpoint`) is asked, with the call's arguments, for the call to make
instead (anything with `function`, `args` and `kwargs`, as submitit's DelayedSubmission): it is pickled
to OUTPUT_DIR/checkpoint.pkl and this exits CHECKPOINTED, on which the job script requeues the job
(outside the container, where scontrol is); the next run finds the checkpoint among its outputs and
makes that call instead. Requeues are bounded by the job's --max-restarts."""

import importlib.util
import os
import pickle
import signal
import sys
import traceback

CHECKPOINTED = 75  # the job script's "checkpointed, run me again" (EX_TEMPFAIL)
# As hpcbox.submitit.script_source and executor name them in the call's folder.
SCRIPT_DIR = "script"
GLOBALS = "globals.pkl"
LAPTOP_PACKAGES_DIR = "laptop-packages"


def main(data_dir: str, output_dir: str, index: str) -> int:
    sys.path.insert(0, data_dir)  # the caller's cloudpickle, where it came along
    sys.path.append(os.path.join(data_dir, LAPTOP_PACKAGES_DIR))
    os.environ["HPCBOX_OUTPUT_DIR"] = output_dir
    checkpoint = os.path.join(output_dir, "checkpoint.pkl")
    source = checkpoint if os.path.exists(checkpoint) else os.path.join(data_dir, f"call-{index}.pkl")
    try:
        define_script(os.path.join(data_dir, SCRIPT_DIR))
        with open(source, "rb") as submitted:
            function, args, kwargs = pickle.load(submitted)
        if source == checkpoint:
            print("hpcbox: resuming the call from its checkpoint", file=sys.stderr, flush=True)
        signal.signal(signal.SIGUSR1, lambda *_: time_is_up(function, args, kwargs, checkpoint))
        outcome = ("success", function(*args, **kwargs))
        status = 0
    except BaseException as exc:  # whatever it raised goes home, as the caller's error
        outcome, status = failure(exc), 1
    try:
        pickled = pickle.dumps(outcome, protocol=4)
    except Exception:
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        pickled = pickle.dumps(("error", "its result could not be pickled", trace, None), protocol=4)
        status = 1
    write_atomically(os.path.join(output_dir, "result.pkl"), pickled)
    return status


def define_script(folder: str) -> None:
    """The laptop's script's definitions, where they came along, as `__main__` (whose names the call's
    pickle refers to), then the values their code reads. Without a module spec, as a script run by
    path: multiprocessing's spawned children define them again from the same file."""
    if not os.path.isdir(folder):
        return
    (name,) = [entry for entry in os.listdir(folder) if entry.endswith(".py")]
    spec = importlib.util.spec_from_file_location("__main__", os.path.join(folder, name))
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    script.__spec__ = None
    sys.modules["__main__"] = script  # this runner's own functions keep their globals
    spec.loader.exec_module(script)
    with open(os.path.join(folder, GLOBALS), "rb") as values:
        for global_name, value in pickle.load(values).items():
            setattr(script, global_name, pickle.loads(value))


def failure(exc: BaseException) -> tuple:
    """``exc`` as the caller's error: its line, the traceback here, and the module it could not import."""
    trace = traceback.format_exc()
    print(trace, file=sys.stderr, flush=True)
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return ("error", f"{type(exc).__name__}: {exc}", trace, missing)


def time_is_up(function, args, kwargs, checkpoint: str) -> None:
    """The time limit is near: checkpoint the call and leave, or say why it cannot and run on."""
    asks = getattr(function, "__submitit_checkpoint__", None) or getattr(function, "checkpoint", None)
    if asks is None:
        print(
            "hpcbox: the time limit is near and the call has no __submitit_checkpoint__ (or checkpoint) "
            "method to resume from: it runs on until the limit",
            file=sys.stderr,
            flush=True,
        )
        return
    instead = asks(*args, **kwargs)
    if instead is None:
        return  # the callable's own choice: no requeue
    call = (instead.function, tuple(instead.args), dict(instead.kwargs))
    try:
        pickled = pickle.dumps(call, protocol=4)
    except (pickle.PicklingError, AttributeError, TypeError):  # no name to pickle it by: by value
        import cloudpickle  # beside the call where it travelled by value

        pickled = cloudpickle.dumps(call, protocol=4)
    write_atomically(checkpoint, pickled)
    print("hpcbox: the call checkpointed before the time limit", file=sys.stderr, flush=True)
    os._exit(CHECKPOINTED)  # at once: the call's own code is cut short where the signal found it


def write_atomically(path: str, data: bytes) -> None:
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
    with open(partial, "wb") as written:
        written.write(data)
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
