"""Prediction: how fast an offline job runs beside an online service, per GPU type.

``features`` turns GPU and job measurements into the model's inputs; ``predictor`` is the
per-GPU-type speed predictor (training, promotion, refusing out-of-range input) with its
networks in ``nets`` and torch-free settings in ``config``; ``pair_tables`` evaluates it over a
round's (GPU, job class) pairs without a row per pair; ``sampling_plan`` decides which
co-location samples to measure next.
"""
