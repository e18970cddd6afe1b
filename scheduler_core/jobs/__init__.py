"""Offline jobs: their state against the cluster's, who may run beside whom, and who competes.

``sync`` decides job-state changes from what the cluster reports (the store applies them);
``admission`` which jobs compete in an overloaded round (shortest remaining work first);
``run_as`` the one-user-per-GPU rule MPS imposes; ``unplaced`` why a job was left out.
The job states themselves are in :mod:`scheduler_core.domain`.
"""
