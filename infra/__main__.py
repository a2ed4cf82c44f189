"""Pulumi entry point: validate the stack's config, compose the components, export the outputs."""

import sys
from pathlib import Path

# The CLI runs this file with infra/ on sys.path; the program's modules import as ``infra.*``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi  # noqa: E402

from infra import config  # noqa: E402
from infra.program import build  # noqa: E402

for key, value in build(config.load()).items():
    pulumi.export(key, value)
