"""One call of hpcbox.submitit, run by the job inside the project's container: `python run_call.py
DATA_DIR OUTPUT_DIR INDEX`. It unpickles call-INDEX.pkl (the function, its arguments) from the job's
staged data, calls it, and pickles the outcome to OUTPUT_DIR/result.pkl, which the job script copies
back beside the job's other results (and whatever the call wrote under `$HPCBOX_OUTPUT_DIR`). Standard
library only: the environment is the project's, and the caller's cloudpickle travels beside the pickle
where a function travels by value.

At the time limit's signal (USR1, which the job script passes on), a callable with
`__submitit_checkpoint__` (or `checkpoint`) is asked, with the call's arguments, for the call to make
instead (anything with `function`, `args` and `kwargs`, as submitit's DelayedSubmission): it is pickled
to OUTPUT_DIR/checkpoint.pkl and this exits CHECKPOINTED, on which the job script requeues the job
(outside the container, where scontrol is); the next run finds the checkpoint among its outputs and
makes that call instead. Requeues are bounded by the job's --max-restarts."""

import os
import pickle
import signal
import sys
import traceback

CHECKPOINTED = 75  # the job script's "checkpointed, run me again" (EX_TEMPFAIL)


def main(data_dir: str, output_dir: str, index: str) -> int:
    sys.path.insert(0, data_dir)  # the caller's cloudpickle, where it came along
    os.environ["HPCBOX_OUTPUT_DIR"] = output_dir
    checkpoint = os.path.join(output_dir, "checkpoint.pkl")
    source = checkpoint if os.path.exists(checkpoint) else os.path.join(data_dir, f"call-{index}.pkl")
    with open(source, "rb") as submitted:
        function, args, kwargs = pickle.load(submitted)
    if source == checkpoint:
        print("hpcbox: resuming the call from its checkpoint", file=sys.stderr, flush=True)
    signal.signal(signal.SIGUSR1, lambda *_: time_is_up(function, args, kwargs, checkpoint))
    try:
        outcome = ("success", function(*args, **kwargs))
        status = 0
    except BaseException as exc:  # whatever it raised goes home, as the caller's error
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        outcome, status = ("error", f"{type(exc).__name__}: {exc}", trace), 1
    try:
        pickled = pickle.dumps(outcome, protocol=4)
    except Exception:
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        pickled = pickle.dumps(("error", "its result could not be pickled", trace), protocol=4)
        status = 1
    write_atomically(os.path.join(output_dir, "result.pkl"), pickled)
    return status


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
    try:
        import cloudpickle as pickler  # beside the call where it travelled by value
    except ImportError:
        pickler = pickle
    call = (instead.function, tuple(instead.args), dict(instead.kwargs))
    write_atomically(checkpoint, pickler.dumps(call, protocol=4))
    print("hpcbox: the call checkpointed before the time limit", file=sys.stderr, flush=True)
    os._exit(CHECKPOINTED)  # at once: the call's own code is cut short where the signal found it


def write_atomically(path: str, data: bytes) -> None:
    partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
    with open(partial, "wb") as written:
        written.write(data)
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
