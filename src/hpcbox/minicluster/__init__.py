"""The mini Slurm-in-Docker cluster (`local` profile): lifecycle used by `hpcbox cluster.*` and tests."""

from hpcbox.minicluster.cluster import Cluster
from hpcbox.minicluster.lifecycle import Removed, down, find, node_states, status, up, wait_ready
from hpcbox.minicluster.spec import ClusterSpec, spec_like

__all__ = [
    "Cluster", "ClusterSpec", "Removed", "down", "find", "node_states", "spec_like", "status", "up",
    "wait_ready",
]  # fmt: skip
