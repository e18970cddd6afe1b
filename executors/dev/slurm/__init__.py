"""The multi-node Slurm dev cluster behind ``muxflow slurm dev-up`` (docs/SLURM.md)."""

from executors.dev.slurm.cluster import DevCluster, DevClusterError, DevStatus
from executors.dev.slurm.layout import DEFAULT_STATE_DIR, DevClusterLayout, DevNode

__all__ = ["DEFAULT_STATE_DIR", "DevCluster", "DevClusterError", "DevClusterLayout", "DevNode", "DevStatus"]
