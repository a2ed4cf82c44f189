"""Failure classes, exit codes and fault-injection points: what every layer above may use."""
