"""The mini Slurm-in-Docker cluster (`local` profile): lifecycle used by `hpcbox cluster.*` and tests."""

from hpcbox.minicluster.cluster import Cluster
from hpcbox.minicluster.lifecycle import (
    Removed,
    add_gpu_type,
    down,
    find,
    node_states,
    refuse_unfinished,
    shared_state,
    status,
    up,
    wait_ready,
)
from hpcbox.minicluster.shape import slurm_like
from hpcbox.minicluster.spec import ClusterSpec, spec_like

__all__ = [
    "Cluster", "ClusterSpec", "Removed", "add_gpu_type", "down", "find", "node_states", "refuse_unfinished",
    "shared_state", "slurm_like", "spec_like", "status", "up", "wait_ready",
]  # fmt: skip
