"""The code location the Dagster webserver and daemon load (``workspace.yaml``).

Settings are read here, when the code location is loaded (``pipelines.settings``);
nothing connects until a run starts.
"""

from pipelines.definitions import build_definitions
from pipelines.settings import load_settings

defs = build_definitions(load_settings())
