"""Development tools: the multi-node Slurm dev cluster behind ``muxflow slurm dev-up`` (``slurm/``), and the
benchmarks that span places (``bench_dispatch``: the dispatcher against the dev cluster; ``bench_node_metrics``:
the node agent's metrics path on a simulated node and store)."""
