"""xCUDA: the LD_PRELOAD library that caps an offline job's GPU memory and paces
its kernel launches (paper §4.1), and exits it gracefully on SIGINT/SIGTERM (§4.2).

The C sources are in ``src/``; ``build.py`` builds them, ``shm.py`` writes the
per-GPU record the library reads. See README.md.
"""
