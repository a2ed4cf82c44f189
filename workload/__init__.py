"""Fault-tolerant fraud-model training on spot capacity: queue, checkpoints, trainer, worker."""

__version__ = "0.1.0"
