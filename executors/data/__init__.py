"""The bundled measurements (``gavel/``, checked by ``SHA256SUMS``) and what is calibrated from them: the
co-location measurement sets (``measurements``) and the calibrated workload catalog (``calibration``) that
real profiling, the node agent, submission and the simulator all read."""
