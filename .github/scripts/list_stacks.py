"""Print ``stacks=<JSON list>`` of the stacks in ``stacks/Pulumi.<stack>.yaml`` for a workflow matrix.

Both workflows run this, so adding a stack file adds it to preview and up with no workflow edit.
Standard library only: it runs before any dependency is installed. Names are checked because they end
up in commands and GitHub environment names.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def stacks(root: Path) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in (root / "stacks").glob("Pulumi.*.yaml"))


def main() -> int:
    names = stacks(Path.cwd())
    bad = [n for n in names if not STACK_NAME.match(n)]
    if bad or not names:
        print(f"error: stack names must match {STACK_NAME.pattern} and one must exist; found {names}", file=sys.stderr)
        return 1
    print("stacks=" + json.dumps(names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
