"""Measurement on a GPU node, inside a profiling or sampling job: the solo-profiling wrapper around a job's script
(``probe``), the co-location harness (``colocate``: an online reference service and an offline reference job on one
GPU), the workload child process (``child``) and the GPU metrics of a window through the node agent's samplers
(``metrics``). The controllers that start these jobs run on the scheduler host (``executors.scheduler.profiling``).
"""
