"""Dagster assets (orchestration layer; docs/DESIGN.md §2).

Thin wrappers over ``scheduler_core`` and the ``executors`` adapters. The
steps they will wrap already exist as plain functions —
``executors.scheduler.predictors`` (predictor training and promotion) and
``executors.scheduler.round_runner`` (plan, record, dispatch, book) — and the main job
(``pipelines.main_job``) calls them in order today.
"""
