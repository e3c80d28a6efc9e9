"""Process group and device: one process per GPU under torchrun (NCCL), or several on CPU (gloo).

torchrun (or `python -m torch.distributed.run`) sets RANK, WORLD_SIZE and LOCAL_RANK; without
them this is a single process and every collective below is a no-op.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hpctrain import HpctrainError


@dataclass(frozen=True)
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# Set by the mini cluster's nodes (hpcbox's rehearsal): its GPUs are device files with no GPU behind.
PLACEHOLDER_GPUS = "HPCBOX_PLACEHOLDER_GPUS"


def gpus_given(environ: Mapping[str, str]) -> int:
    """The GPUs Slurm gave this node's part of the job (SLURM_GPUS_ON_NODE); 0 outside such a job."""
    given = environ.get("SLURM_GPUS_ON_NODE", "")
    return int(given) if given.isdigit() else 0


def device_for_given_gpus(given: int, cuda_build: str | None, visible: int, placeholders: bool) -> str | None:
    """The device a job given ``given`` GPUs trains on under --device auto, or None where it was given
    none. A job holding GPUs it cannot use stops here rather than training on the CPU for hours."""
    if given == 0:
        return None
    plural = "s" if given > 1 else ""
    if cuda_build is None:
        raise HpctrainError(
            f"this job was given {given} GPU{plural}, but its PyTorch ({torch.__version__}) is a CPU build: "
            "it would train on the CPU while holding them",
            hint="run it in an environment with CUDA (hpcbox submit --flavour cuda), "
            "or pass --device cpu to train on the CPU knowingly",
        )
    if visible >= given:
        return "cuda"
    if placeholders:
        print(
            f"hpctrain: the {given} GPU{plural} this job was given {'are' if given > 1 else 'is'} the mini "
            "cluster's placeholders "
            f"(PyTorch {torch.__version__} has CUDA {cuda_build} and would use real ones): "
            "training on the CPU",
            file=sys.stderr,
        )
        return "cpu"
    raise HpctrainError(
        f"this job was given {given} GPU{plural}, but PyTorch sees {visible}",
        hint="the container needs --nv and the node an NVIDIA driver (nvidia-smi there says), "
        "or pass --device cpu to train on the CPU knowingly",
    )


def _resolve_device(choice: str, local_rank: int) -> torch.device:
    if choice == "auto":
        given = device_for_given_gpus(
            gpus_given(os.environ),
            torch.version.cuda,
            torch.cuda.device_count() if torch.version.cuda else 0,
            bool(os.environ.get(PLACEHOLDER_GPUS)),
        )
        if given is not None:
            choice = given
    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        raise HpctrainError(
            "--device cuda: torch sees no CUDA device",
            hint="request a GPU (sbatch --gres=gpu:1, apptainer exec --nv) or use --device auto/cpu",
        )
    if choice == "cpu" or not cuda:
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise HpctrainError(
            f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} visible",
            hint="start at most one process per GPU (torchrun --nproc-per-node = GPUs per node)",
        )
    return torch.device("cuda", local_rank)


def libuv_available() -> bool:
    """Whether this PyTorch build has libuv (Debian's 2.6 has not, but TCPStore still defaults to it)."""
    try:
        dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    except RuntimeError as exc:
        if "libuv" in str(exc):
            return False
        raise
    return True


def _store(rank: int, world_size: int) -> dist.TCPStore:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, made here rather than by init_process_group,
    whose torchelastic path ignores USE_LIBUV and so fails on builds without libuv."""
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not agent_hosts_store,
        timeout=timedelta(minutes=10),
        multi_tenant=True,
        use_libuv=libuv_available(),
    )


def setup(device_choice: str) -> Runtime:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _resolve_device(device_choice, local_rank)
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend, store=_store(rank, world_size), rank=rank, world_size=world_size
        )
    return Runtime(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


# Tensors of the latest collectives, referenced from Python until the process group is gone.
# A gloo worker thread drops its reference to a finished collective's tensors a moment after the
# caller has returned; if Python has let go first, freeing the tensor takes the GIL. Meanwhile
# the main thread holds the GIL in ProcessGroupGloo's destructor, which waits for that worker
# thread: a deadlock at exit (pytorch/pytorch#56297; torch 2.8 releases the GIL there, #154976,
# Debian's 2.6 does not). 64 collectives back is far beyond any worker thread's lag.
_recent_tensors: deque[torch.Tensor] = deque(maxlen=64)


def _hold(*tensors: torch.Tensor) -> None:
    _recent_tensors.extend(tensors)


def teardown(runtime: Runtime) -> None:
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
    _recent_tensors.clear()


def largest_across_ranks(runtime: Runtime, values: list[int]) -> list[int]:
    """Element-wise MAX across ranks, so every rank takes the same branch at the same step: a flag set
    on any rank is set on all, and a signal caught on any rank is the one every rank names."""
    if not runtime.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.int32, device=runtime.device)
    _hold(tensor)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def sum_across_ranks(runtime: Runtime, tensor: torch.Tensor) -> torch.Tensor:
    if runtime.distributed:
        tensor = tensor.clone()
        _hold(tensor)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def average_buffers(runtime: Runtime, module: torch.nn.Module) -> None:
    """Make BatchNorm running statistics equal on every rank: DDP only broadcasts rank 0's at the
    start of each forward, so after the last step each rank holds stats of its own last batch."""
    if not runtime.distributed:
        return
    for buffer in module.buffers():
        if buffer.is_floating_point():
            _hold(buffer)
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            buffer.div_(runtime.world_size)


def gather(runtime: Runtime, value: str) -> list[str]:
    if not runtime.distributed:
        return [value]
    # all_gather_object's own tensors die inside it, out of _hold's reach: gather bytes instead.
    data = torch.tensor(list(value.encode()), dtype=torch.uint8, device=runtime.device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=runtime.device)
    sizes = [torch.zeros_like(size) for _ in range(runtime.world_size)]
    _hold(size, *sizes)
    dist.all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(*lengths, 1), dtype=torch.uint8, device=runtime.device)
    padded[: data.numel()] = data
    gathered = [torch.zeros_like(padded) for _ in range(runtime.world_size)]
    _hold(padded, *gathered)
    dist.all_gather(gathered, padded)
    return [bytes(t[:n].tolist()).decode() for t, n in zip(gathered, lengths, strict=True)]


def barrier(runtime: Runtime) -> None:
    if runtime.distributed:
        dist.barrier()
