"""The rendered stacks as committed snapshots: every resource (type, name, parent, provider, dependencies,
options, inputs with secrets masked), the stack outputs and the Kubernetes manifests, for every stack in
``stacks/`` plus one with the ``Pulumi.yaml`` defaults alone (``DEFAULTS``).

A refactoring of ``infra/`` must leave them byte for byte (tests/infra/test_infra_snapshot.py); a change that
means to alter what a stack declares regenerates them deliberately, in a commit of its own saying why:

    .venv/bin/python -m tests.infra.snapshot            # every stack
    .venv/bin/python -m tests.infra.snapshot dev prod   # some
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from infra import render

SNAPSHOT_DIR = Path(__file__).resolve().parent / "snapshots"
# No stacks/Pulumi.<DEFAULTS>.yaml: rendered with the Pulumi.yaml defaults, as `pulumi stack init` would.
DEFAULTS = "defaults"
# A stack file's settings leave parts of the program unrendered (dev has no bucket, so no identities, scoring or
# schedule; no stack is Standard mode): these variants, "<stack>+<variant>", render them with overrides.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dev+data": ("dev", {
        "datasetUri": "gs://acme-fraud/exports", "outputUri": "gs://acme-results/runs/v1", "schedule": "0 3 * * *",
        "runs": {"main": {}, "lr3": {"lr": 0.003}}, "parallelism": 2,
        "datasetColumns": {"ts": "TX_DATETIME"}, "datasetDatetimeFormat": "%d/%m/%Y %H:%M",
    }),
    "prod+standard": ("prod", {
        "clusterMode": "standard", "onDemandFallback": False, "filestoreTier": "ZONAL", "filestoreCapacityGb": 1024,
        "datasetUri": "gs://acme-fraud/exports", "pinToShareZone": "true",
    }),
}  # fmt: skip


def stacks() -> list[str]:
    return [*render.stack_names(), DEFAULTS, *VARIANTS]


def path(stack: str) -> Path:
    return SNAPSHOT_DIR / f"{stack}.json"


def _manifest_name(manifest: dict[str, Any]) -> str:
    """The file ``make render`` writes the manifest to (infra/render.py ``write``), without ``.yaml``."""
    metadata = manifest.get("metadata", {})
    parts = [manifest["kind"], metadata.get("namespace", ""), metadata.get("name", "")]
    return "-".join(re.sub(r"[^a-z0-9.]+", "-", str(p).lower()) for p in parts if p)


def snapshot(stack: str) -> dict[str, Any]:
    """What ``make render STACK=<stack>`` declares, in an order that does not depend on registration order."""
    base, overrides = VARIANTS.get(stack, (stack, {}))
    rendered = render.render(base, overrides)
    plain = render._plain_numbers  # noqa: SLF001 - the same numbers make render writes
    resources = [
        {
            "type": r.type,
            "name": r.name,
            "urn": r.urn,
            "parent": r.parent,
            "provider": r.provider,
            "dependencies": sorted(r.dependencies),
            "propertyDependencies": {k: sorted(v) for k, v in sorted(r.property_dependencies.items())},
            "protect": r.protect,
            "deleteBeforeReplace": r.delete_before_replace,
            "ignoreChanges": sorted(r.ignore_changes),
            "replaceOnChanges": sorted(r.replace_on_changes),
            "customTimeouts": r.custom_timeouts,
            "inputs": plain(r.masked_inputs),
        }
        for r in sorted(rendered.resources, key=lambda r: r.urn)
    ]
    manifests = {_manifest_name(m): plain(m) for m in rendered.manifests(masked=True)}
    return {
        "stack": stack,
        "resources": resources,
        "manifests": dict(sorted(manifests.items())),
        "outputs": plain(render.mask_secrets(rendered.outputs)),
        "warnings": rendered.warnings,
    }


def dumps(stack: str) -> str:
    return json.dumps(snapshot(stack), indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    SNAPSHOT_DIR.mkdir(exist_ok=True)
    for stack in argv or stacks():
        path(stack).write_text(dumps(stack))
        print(f"wrote {path(stack).relative_to(render.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
