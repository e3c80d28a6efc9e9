"""One call of hpcbox.submitit, run by the job inside the project's container: `python run_call.py
DATA_DIR OUTPUT_DIR INDEX`. It unpickles call-INDEX.pkl (the function, its arguments) from the job's
staged data, calls it, and pickles the outcome to OUTPUT_DIR/result.pkl, which the job script copies
back beside the job's other results. Standard library only: the environment is the project's, and the
caller's cloudpickle travels beside the pickle where a function travels by value."""

import os
import pickle
import sys
import traceback


def main(data_dir: str, output_dir: str, index: str) -> int:
    sys.path.insert(0, data_dir)  # the caller's cloudpickle, where it came along
    with open(os.path.join(data_dir, f"call-{index}.pkl"), "rb") as submitted:
        function, args, kwargs = pickle.load(submitted)
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
    partial = os.path.join(output_dir, ".result.pkl.partial")
    with open(partial, "wb") as written:
        written.write(pickled)
    os.replace(partial, os.path.join(output_dir, "result.pkl"))
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
