"""Run the policy pack's rules over a stack rendered under the SDK's mocks: no CLI, cloud or credentials.

It feeds the rules what the engine would: resource rules get each resource's inputs (camelCase, as the
SDK sends them, secrets unwrapped), stack rules get each resource's outputs (the mocks echo inputs and
fabricate computed values; the resource's ``id`` is added, as bridged providers report it among outputs).
``python -m policy.offline STACK [key=value ...]`` (``make render STACK=... ARGS=...``) also writes the
manifests and an inventory, and lists the Google roles of every service account.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import render
from infra.config import DATA_LOSS_KEY
from infra.render import Registered, Rendered
from policy import rules
from policy.pack import NAME, stack_facts

BUILD_DIR = render.REPO_ROOT / "build" / "render"


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str
    resource: str  # "type name" of the resource, or the stack
    message: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.policy}: {self.resource}: {self.message}"


def facts_of(rendered: Rendered) -> rules.StackFacts:
    """The facts the pack reads from ``PULUMI_STACK``/``PULUMI_CONFIG``, from the validated config."""
    cfg = rendered.config
    config = {
        "env": cfg.labels.env,
        "team": cfg.labels.team,
        "onDemandFallback": str(cfg.gpu.on_demand_fallback),
        "datasetUri": cfg.data.dataset.uri if cfg.data.dataset else "",
        "outputUri": cfg.data.output.uri if cfg.data.output else "",
        DATA_LOSS_KEY: str(not cfg.cluster.deletion_protection),
    }
    return stack_facts(config, stack=rendered.stack)


def stack_view(resource: Registered) -> rules.Resource:
    """A resource as ``StackValidationArgs`` shows it: outputs, secrets unwrapped, ``id`` included."""
    props = render.unwrap_secrets(dict(resource.outputs))
    if resource.id and "id" not in props:
        props["id"] = resource.id
    return rules.Resource(resource.type, resource.name, resource.urn, props)


def check(resources: Sequence[Registered], facts: rules.StackFacts) -> list[Violation]:
    """Every rule over every resource, in the order of ``rules.RULES``."""
    by_urn = {r.urn: f"{r.type} {r.name}" for r in resources}
    views = [stack_view(r) for r in resources]
    found = []
    for rule in rules.RULES:
        if rule.check_resource is not None:
            for r in resources:
                extra = {"protect": r.protect} if rule.reads_protect else {}
                for message in rule.check_resource(r.type, r.inputs, facts, **extra):
                    found.append(Violation(rule.name, rule.level, by_urn[r.urn], message))
        if rule.check_stack is not None:
            for urn, message in rule.check_stack(views, facts):
                found.append(Violation(rule.name, rule.level, by_urn.get(urn, "stack"), message))
    return found


def check_rendered(rendered: Rendered) -> list[Violation]:
    return check(rendered.resources, facts_of(rendered))


def mandatory(violations: Sequence[Violation]) -> list[Violation]:
    return [v for v in violations if v.level == rules.MANDATORY]


def render_and_check(
    stack: str, out_dir: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[Rendered, list[Path], list[Violation]]:
    """What ``make render`` does: render ``stack`` (with config ``overrides``) under mocks, write it to
    ``out_dir`` (default ``build/render/<stack>``) and run the pack over it."""
    rendered = render.render(stack, overrides)
    written = render.write(rendered, out_dir or BUILD_DIR / stack)
    return rendered, written, check_rendered(rendered)


def identities(rendered: Rendered) -> list[str]:
    """One line per Google role a workload's or the nodes' service account holds, and per Workload
    Identity binding: who can do what, on which resource."""
    lines = []
    for r in rendered.resources:
        inputs = r.inputs
        if r.type in rules.PROJECT_IAM:
            lines.append(f"{inputs.get('member')}: {inputs.get('role')} on project {inputs.get('project')}")
        elif r.type in rules.BUCKET_IAM:
            condition = _condition(inputs)
            lines.append(f"{inputs.get('member')}: {inputs.get('role')} on bucket {inputs.get('bucket')}{condition}")
        elif r.type == rules.SA_IAM_MEMBER:
            lines.append(f"{inputs.get('member')}: {inputs.get('role')} on {inputs.get('serviceAccountId')}")
    return sorted(lines)


def _condition(inputs: Mapping[str, Any]) -> str:
    condition = inputs.get("condition")
    return f" if {condition.get('expression')}" if isinstance(condition, Mapping) else ""


def main(argv: list[str] | None = None) -> int:
    """``python -m policy.offline STACK [--out DIR]``: exit 1 on a mandatory violation, 2 on bad config."""
    parser = argparse.ArgumentParser(prog="python -m policy.offline", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("stack", type=render.stack_name, help="a stack; without stacks/Pulumi.<stack>.yaml: defaults")
    parser.add_argument("--out", type=Path, help="output folder (default build/render/STACK)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (YAML values)")
    args = parser.parse_intermixed_args(argv)
    try:
        overrides = render.parse_overrides(args.overrides)
        rendered, written, violations = render_and_check(args.stack, args.out, overrides)
    except (render.config.ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = written[-1].parent
    print(f"{args.stack}: {len(rendered.resources)} resources, {len(written) - 1} Kubernetes manifests -> {out}")
    print("Google identities (who holds which role, on what):")
    for line in identities(rendered):
        print(f"  {line}")
    for v in violations:
        print(v)
    blocking = mandatory(violations)
    print(
        f"policy pack {NAME}: {len(blocking)} mandatory, "
        f"{len(violations) - len(blocking)} advisory violation(s) across {len(rules.RULES)} rules"
    )
    return 1 if blocking else 0


if __name__ == "__main__":
    raise SystemExit(main())
