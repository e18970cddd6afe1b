"""MuxFlow on Slurm, on the scheduler host: the dispatcher (``backend``: plans → held jobs released onto their
GPUs), pick-up of ``sbatch -p offline`` submissions (``pickup``), job-state sync (``sync``, ``node_faults``), the
deployment's Slurm configuration (``config``) and ``job_submit.lua``, which slurmctld runs at every submission.
The REST client and the plan schema they use are in ``executors.slurm``."""
