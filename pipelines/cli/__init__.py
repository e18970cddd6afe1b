"""The ``muxflow`` command line (``pipelines/cli/main.py`` lists every command, one module per concern).

Shared pieces (the one-line error, the store, the settings, the cluster backend) are in
``pipelines/cli/common.py``. Run as ``muxflow …`` or ``python -m pipelines.cli …``.
"""

from pipelines.cli.main import main

__all__ = ["main"]
