"""The code location the Dagster webserver and daemon load (``workspace.yaml``).

Settings are read here, when the code location is loaded (``pipelines.settings``);
nothing connects until a run starts.
"""

from pipelines.definitions import build_definitions
from pipelines.settings import load_settings, settings_file

_settings = load_settings()
_settings.check_secrets(settings_file())  # a token, key or settings file others can read: the location does not load
defs = build_definitions(_settings)
