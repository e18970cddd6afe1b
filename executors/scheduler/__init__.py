"""The scheduler host: what runs beside Dagster, with MuxFlow's own identity.

- ``round_runner`` / ``round_service`` — one scheduling round end to end, and the loop that repeats it;
- ``steps``       — the pipeline's steps (profiles → feature store → predictors → matching) the assets call;
- ``slurm/``      — the Slurm REST client, the backend and dispatcher, pick-up of held jobs, state sync, the
  signed plan (``slurm/plan.py``) and ``job_submit.lua`` (run by slurmctld);
- ``profiling/``  — profiling windows and co-location runs, and the metrics they yield;
- ``submission``, ``job_status`` — submitting and following jobs from the CLI;
- ``metrics``     — the scheduler's Prometheus endpoint.
"""
