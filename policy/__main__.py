"""Entry point the Pulumi CLI runs for ``pulumi preview --policy-pack policy``."""

import sys
from pathlib import Path

# The rules share the program's constants (infra/contract.py, infra/gke.py, infra/config.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policy import pack  # noqa: E402

PolicyPack(name=pack.NAME, policies=pack.policies(), enforcement_level=EnforcementLevel.MANDATORY)
