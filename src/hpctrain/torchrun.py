"""`python -m hpctrain.torchrun ...`: PyTorch's own torchrun, usable with builds that lack libuv.

Debian's python3-torch 2.6 is built without libuv, yet its TCPStore still defaults to
use_libuv=True, and torchrun's rendezvous backends create TCPStores without passing the flag (nor
reading USE_LIBUV), so `torchrun` dies with "use_libuv was requested but PyTorch was build without
libuv support". This wrapper makes the default follow the build (and USE_LIBUV, if set), then
hands over to torch.distributed.run unchanged; the trainer's processes make their own store the same
way. With a PyTorch that has libuv (PyPI wheels) it changes nothing, and plain torchrun works too.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from hpctrain.distributed import libuv_available


class _TCPStore(dist.TCPStore):
    use_libuv_default = True

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("use_libuv", self.use_libuv_default)
        super().__init__(*args, **kwargs)


def main() -> None:
    wanted = os.environ.get("USE_LIBUV")
    _TCPStore.use_libuv_default = wanted == "1" if wanted is not None else libuv_available()
    if not _TCPStore.use_libuv_default:
        dist.TCPStore = _TCPStore  # before torchrun's modules bind the name
    from torch.distributed.run import main as torchrun

    torchrun()


if __name__ == "__main__":
    main()
