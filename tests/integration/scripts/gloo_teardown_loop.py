"""Run inside the trainer image: two processes create, use and destroy N gloo process groups the
way `hpctrain train` ends (gather, barrier, teardown), and print one JSON line with each rank's
exit code and iterations completed. A rank stuck longer than STALL_S is stopped by faulthandler
(exit 1), so a deadlock at teardown shows as a non-zero code instead of a hang.

Before hpctrain held its collectives' tensors, 4 of 10 ten-iteration runs deadlocked here.
"""

import faulthandler
import json
import multiprocessing
import os
import sys

STALL_S = 30


def worker(rank: int, first_port: int, iterations: int, progress) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    from hpctrain import distributed

    for i in range(iterations):
        os.environ["MASTER_PORT"] = str(first_port + i)
        faulthandler.dump_traceback_later(STALL_S, exit=True)
        runtime = distributed.setup("cpu")
        values = distributed.gather(runtime, f"rank{rank}-iteration{i}-" + "x" * (i % 7 * rank))
        distributed.barrier(runtime)
        distributed.teardown(runtime)
        faulthandler.cancel_dump_traceback_later()
        if values != [f"rank0-iteration{i}-", f"rank1-iteration{i}-" + "x" * (i % 7)]:
            sys.exit(f"rank {rank}, iteration {i}: gathered {values}")
        progress[rank] = i + 1


def main() -> None:
    iterations = int(sys.argv[1])
    context = multiprocessing.get_context("spawn")
    progress = context.Array("i", 2)
    ranks = [context.Process(target=worker, args=(r, 20000, iterations, progress)) for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    print(json.dumps({"exit_codes": [p.exitcode for p in ranks], "iterations": list(progress)}))


if __name__ == "__main__":
    main()
