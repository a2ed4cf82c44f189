"""A preview that names data loss: what a config change would replace, before anyone runs ``pulumi up``.

``python -m infra.diff dev zone=us-central1-b`` (``make diff STACK=dev ARGS=...``) renders the stack as
configured and again with the changes, under the mock engine, and compares them resource by resource:
created, deleted, replaced (a change to an input that ``infra.replacements`` lists, or an input that
depends on a replaced resource's outputs, such as the PV on a new Filestore IP) and updated in place.
A replaced stateful resource (the share, the cluster, a bucket grant) is printed loudly with what it
destroys, and the exit status is 1, so a script can stop there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import config, render, replacements
from infra.render import Registered, Rendered

_MISSING = object()


@dataclass(frozen=True)
class Change:
    """One resource's fate: ``action`` is create, delete, replace or update; ``why`` the paths or cause."""

    action: str
    type: str
    name: str
    urn: str
    why: str = ""

    @property
    def loses(self) -> str:
        """What is destroyed ('' unless a stateful resource is replaced or deleted)."""
        return replacements.stateful(self.type) if self.action in ("replace", "delete") else ""


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _changed_paths(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths whose values differ (a list is one value)."""
    paths = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            paths += _changed_paths(a, b, f"{prefix}{key}.")
        elif a != b:
            paths.append(prefix + key)
    return paths


def _replaced_by_inputs(old: Registered, new: Registered) -> list[str]:
    return [p for p in replacements.replace_paths(new.type) if _at(old.inputs, p) != _at(new.inputs, p)]


def _follows(resource: Registered, replaced: set[str]) -> str:
    """The replaced resource whose outputs feed one of ``resource``'s replace-on-change inputs, if any.
    Its new outputs (a new IP) are unknown until it is created, so ``pulumi preview`` shows the dependent
    replaced too; where the new value turns out equal (a fixed name), ``pulumi up`` keeps it."""
    for path in replacements.replace_paths(resource.type):
        for urn in resource.property_dependencies.get(path.split(".")[0], []):
            if urn in replaced:
                return f"{path} takes outputs of the replaced {urn.rsplit('::', 1)[-1]}"
    return ""


def compare(before: Rendered, after: Rendered) -> list[Change]:
    """Every resource that is created, deleted, replaced or updated going from ``before`` to ``after``."""
    old = {r.urn: r for r in before.resources}
    new = {r.urn: r for r in after.resources}
    changes = {u: Change("create", r.type, r.name, u) for u, r in new.items() if u not in old}
    changes |= {u: Change("delete", r.type, r.name, u) for u, r in old.items() if u not in new}
    both = [u for u in new if u in old]
    for urn in both:
        paths = _replaced_by_inputs(old[urn], new[urn])
        if paths:
            changes[urn] = Change("replace", new[urn].type, new[urn].name, urn, ", ".join(paths))
    grew = True
    while grew:  # a replacement can feed another one (Filestore -> PV), to any depth
        replaced = {u for u, c in changes.items() if c.action == "replace"}
        grew = False
        for urn in both:
            cause = "" if urn in replaced else _follows(new[urn], replaced)
            if cause:
                changes[urn] = Change("replace", new[urn].type, new[urn].name, urn, cause)
                grew = True
    for urn in both:
        paths = _changed_paths(old[urn].inputs, new[urn].inputs)
        if urn not in changes and paths:
            changes[urn] = Change("update", new[urn].type, new[urn].name, urn, ", ".join(paths))
    order = {"delete": 0, "replace": 1, "create": 2, "update": 3}
    return sorted(changes.values(), key=lambda c: (not c.loses, order[c.action], c.type, c.name))


def report(changes: list[Change], protected: bool) -> list[str]:
    """The lines ``make diff`` prints: data loss first, in capitals, then everything else."""
    lines = []
    for c in changes:
        line = f"  {c.action:<8} {c.type} {c.name}" + (f"  ({c.why})" if c.why else "")
        if c.loses:
            guard = (
                "deletion protection will stop `pulumi up` half-way; set allowDataLoss only if the data may go"
                if protected else "allowDataLoss is set: the data WILL BE DELETED"
            )
            line = f"!! DATA LOSS: {line.strip()}\n     destroys {c.loses}; {guard}"
        lines.append(line)
    lost = sum(1 for c in changes if c.loses)
    counts = {a: sum(1 for c in changes if c.action == a) for a in ("replace", "create", "delete", "update")}
    summary = ", ".join(f"{n} {a}" for a, n in counts.items() if n) or "no change"
    lines.append(f"{summary}; {lost} stateful resource(s) destroyed" if lost else summary)
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m infra.diff STACK key=value ...``: exit 1 when a stateful resource would be replaced."""
    parser = argparse.ArgumentParser(prog="python -m infra.diff", description=main.__doc__, allow_abbrev=False)
    parser.add_argument("stack", type=render.stack_name)
    parser.add_argument("changes", nargs="+", metavar="key=value", help="the config change to preview")
    args = parser.parse_args(argv)
    try:
        overrides = render.parse_overrides(args.changes)
        before, after = render.render(args.stack), render.render(args.stack, overrides)
    except (config.ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    changes = compare(before, after)
    print(f"{args.stack}: {' '.join(args.changes)}")
    for line in report(changes, protected=after.config.cluster.deletion_protection):
        print(line)
    return 1 if any(c.loses for c in changes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
