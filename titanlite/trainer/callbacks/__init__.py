"""What runs around the training loop, as callbacks (base.Callback's hooks), called in the
trainer's order: the Hugging Face load at the start, the save when due, the profiler, memory
snapshots, gc, the preemption agreement (which may save once more), the Hugging Face export at
the end, and the metrics."""

from titanlite.trainer.callbacks.base import Callback, Callbacks
from titanlite.trainer.callbacks.checkpoint import CheckpointWhenDue, HFExport, HFInitialLoad, Saver
from titanlite.trainer.callbacks.garbage import GarbageCollection
from titanlite.trainer.callbacks.metrics import MetricsLogging
from titanlite.trainer.callbacks.preemption import PreemptionAgreement
from titanlite.trainer.callbacks.profiling import MemorySnapshots, Profiler

__all__ = [
    "Callback",
    "Callbacks",
    "CheckpointWhenDue",
    "GarbageCollection",
    "HFExport",
    "HFInitialLoad",
    "MemorySnapshots",
    "MetricsLogging",
    "PreemptionAgreement",
    "Profiler",
    "Saver",
]
