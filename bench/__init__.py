"""Benchmarks (`make bench`) and the chaos run (`make chaos`): figures and faults, never part of `make test`
except the short chaos run in tests/chaos."""
