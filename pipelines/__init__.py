"""Wiring: the CLI, the main job and (with Dagster) definitions, schedules and sensors."""
