"""The offline-job runtime helper: checkpoint on signal, resume from the newest valid checkpoint,
iteration timing and profiling mode."""

from executors.job.runtime.checkpoint import CheckpointStore, CorruptCheckpoint
from executors.job.runtime.loop import EXIT_CHECKPOINTED, Runtime, restore_training
from executors.job.runtime.profiling import ProfileSession, ProfilingConfigError, ProfilingMode
from executors.job.runtime.timing import IterationStats, IterationTimer, summarize

__all__ = ["EXIT_CHECKPOINTED", "CheckpointStore", "CorruptCheckpoint", "IterationStats", "IterationTimer",
           "ProfileSession", "ProfilingConfigError", "ProfilingMode", "Runtime", "restore_training", "summarize"]
