"""``python -m pipelines.cli …``: the same as ``muxflow …``."""

import sys

from pipelines.cli import main

sys.exit(main())
