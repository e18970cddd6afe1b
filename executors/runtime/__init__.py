"""The offline-job runtime helper: checkpoint on signal, resume from the newest valid checkpoint."""

from executors.runtime.checkpoint import CheckpointStore, CorruptCheckpoint
from executors.runtime.loop import EXIT_CHECKPOINTED, Runtime

__all__ = ["EXIT_CHECKPOINTED", "CheckpointStore", "CorruptCheckpoint", "Runtime"]
