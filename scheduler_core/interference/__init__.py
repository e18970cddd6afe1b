"""Interference: what two workloads sharing a GPU do to each other — the model behind every
simulated GPU.

``pairs`` is the pair formula x = 1 / (1 + σ_A·π_B) and the per-job fit; ``transfer`` the model
that carries σ and π across GPU types from what profiling measures (with its per-type anchor,
noise weights and prediction intervals); ``errors`` how well both predict pairs they were not
fitted on; ``gpu_model`` the simulated GPU's device metrics with online load, MPS shares and
xCUDA pacing; ``composition`` several offline jobs on one GPU against the round's slot rule.
"""
