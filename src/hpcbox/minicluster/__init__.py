"""The mini Slurm-in-Docker cluster (`local` profile): lifecycle used by `hpcbox cluster.*` and tests.

Each name below comes from the module that holds it, imported when first used: a command that only
reads a cluster's spec (every command's start does, through the CLI's modules) does not load the Docker
SDK and testcontainers, which cost a third of a second before anything else happens.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOLDER = {
    "Cluster": "cluster",
    "Incarnation": "cluster",
    "removed_incarnations": "cluster",
    "Removed": "lifecycle",
    "add_gpu_type": "lifecycle",
    "down": "lifecycle",
    "find": "cluster",
    "node_states": "lifecycle",
    "refuse_unfinished": "lifecycle",
    "shared_state": "cluster",
    "status": "lifecycle",
    "up": "lifecycle",
    "wait_ready": "lifecycle",
    "slurm_like": "shape",
    "ClusterSpec": "spec",
    "spec_like": "spec",
}
__all__ = [
    "Cluster", "ClusterSpec", "Incarnation", "Removed", "add_gpu_type", "down", "find", "node_states",
    "refuse_unfinished", "removed_incarnations", "shared_state", "slurm_like", "spec_like", "status", "up",
    "wait_ready",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _HOLDER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOLDER[name]}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from hpcbox.minicluster.cluster import Cluster, Incarnation, find, removed_incarnations, shared_state
    from hpcbox.minicluster.lifecycle import (
        Removed,
        add_gpu_type,
        down,
        node_states,
        refuse_unfinished,
        status,
        up,
        wait_ready,
    )
    from hpcbox.minicluster.shape import slurm_like
    from hpcbox.minicluster.spec import ClusterSpec, spec_like
