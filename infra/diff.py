"""A preview that names data loss: what a config change would replace, before anyone runs ``pulumi up``.

``python -m infra.diff dev zone=us-central1-b`` (``make diff STACK=dev ARGS=...``) renders the stack as
configured and again with the changes, under the mock engine, and compares them resource by resource:
created, deleted, replaced (a change to an input that ``infra.replacements`` lists, or an input that
depends on a replaced resource's outputs, such as the PV on a new Filestore IP, or one that the resource's
``replaceOnChanges`` option names) and updated in place. A replaced or deleted stateful resource (the share,
the cluster) is printed loudly with what it destroys and what stops it (Pulumi's ``protect``, the
provider's deletion protection, or nothing under ``allowDataLoss``); so is an update the Kubernetes API
refuses (a Job's podFailurePolicy); then the exit status is 1, so a script can stop there.
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
    """One resource's fate: ``action`` is create, delete, replace or update; ``why`` the paths or cause;
    ``fails`` why the API server will refuse an update; ``protect`` the resource's Pulumi protect option."""

    action: str
    type: str
    name: str
    urn: str
    why: str = ""
    fails: str = ""
    guard: str = ""  # what stops a replacement or deletion, or that nothing does

    @property
    def protect(self) -> bool:
        """Pulumi's protect refuses it before anything happens."""
        return self.guard == REFUSED

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


def _named(changed: str, option: str) -> bool:
    """Whether the replaceOnChanges entry ``option`` covers the changed path (``*`` is any path)."""
    option = option.removesuffix(".*").removesuffix("[*]")
    return option == "*" or changed == option or changed.startswith(option + ".")


def _replaced_by_inputs(old: Registered, new: Registered) -> list[str]:
    facts = [
        p for p in replacements.replace_paths(new.type)
        if (a := _at(old.inputs, p)) != (b := _at(new.inputs, p)) and replacements.replaces(new.type, p, a, b)
    ]
    changed = _changed_paths(old.inputs, new.inputs)
    chosen = [o for o in new.replace_on_changes if o not in facts and any(_named(c, o) for c in changed)]
    return facts + [f"{o} (replaceOnChanges)" for o in chosen]


def _refused(old: Registered, new: Registered) -> list[str]:
    """Changed paths that the API server refuses to update (the update fails)."""
    return [p for p in replacements.immutable_paths(new.type) if _at(old.inputs, p) != _at(new.inputs, p)]


def _follows(resource: Registered, replaced: set[str]) -> str:
    """The replaced resource whose outputs feed one of ``resource``'s replace-on-change inputs, if any.
    Its new outputs (a new IP) are unknown until it is created, so ``pulumi preview`` shows the dependent
    replaced too; where the new value turns out equal (a fixed name), ``pulumi up`` keeps it."""
    for key in dict.fromkeys(p.split(".")[0] for p in replacements.follow_paths(resource.type)):
        for urn in resource.property_dependencies.get(key, []):
            if urn in replaced:
                return f"{key} takes outputs of the replaced {urn.rsplit('::', 1)[-1]}"
    provider = resource.provider.rsplit("::", 1)[0]
    if provider in replaced:
        return f"its provider {provider.rsplit('::', 1)[-1]!r} is replaced"
    return ""


REFUSED = "Pulumi's protect makes `pulumi up` refuse it before anything is created"


def _guard(old: Registered, new: Registered | None) -> str:
    """What stops the replacement (``new``) or deletion (``new`` None) of ``old``.

    The engine refuses to replace a resource protected before and after (pulumi pkg/resource/deploy/
    step_generator.go: ``if new.Protect && old.Protect`` -> "unable to replace resource ... as it is currently
    marked for protection"), and to delete a protected one (DeleteStep.Apply); lifting protect in the same
    update lets the replacement through. Otherwise the provider's own deletion protection, where the old
    resource has it on, fails the delete: after a replacement's create, so `pulumi up` stops half-way."""
    if old.protect and (new is None or new.protect):
        return REFUSED
    lifted = " (its protect is lifted in this same update, which lets the replacement through)" if old.protect else ""
    if replacements.deletion_protected(old.type, old.inputs):
        when = "the delete" if new is None else "`pulumi up` half-way, after the new one is created"
        return f"the provider's deletion protection stops {when}{lifted}"
    return f"nothing stops it{lifted}: the data WILL BE DELETED"


def compare(before: Rendered, after: Rendered) -> list[Change]:
    """Every resource that is created, deleted, replaced or updated going from ``before`` to ``after``."""
    old = {r.urn: r for r in before.resources}
    new = {r.urn: r for r in after.resources}
    changes = {u: Change("create", r.type, r.name, u) for u, r in new.items() if u not in old}
    changes |= {u: Change("delete", r.type, r.name, u, guard=_guard(r, None)) for u, r in old.items() if u not in new}
    both = [u for u in new if u in old]
    for urn in both:
        paths = _replaced_by_inputs(old[urn], new[urn])
        if paths:
            changes[urn] = Change("replace", new[urn].type, new[urn].name, urn, ", ".join(paths),
                                  guard=_guard(old[urn], new[urn]))
    grew = True
    while grew:  # a replacement can feed another one (Filestore -> PV), to any depth
        replaced = {u for u, c in changes.items() if c.action == "replace"}
        grew = False
        for urn in both:
            cause = "" if urn in replaced else _follows(new[urn], replaced)
            if cause:
                changes[urn] = Change("replace", new[urn].type, new[urn].name, urn, cause,
                                      guard=_guard(old[urn], new[urn]))
                grew = True
    for urn in both:
        paths = _changed_paths(old[urn].inputs, new[urn].inputs)
        if urn not in changes and paths:
            refused = ", ".join(_refused(old[urn], new[urn]))
            changes[urn] = Change("update", new[urn].type, new[urn].name, urn, ", ".join(paths), fails=refused)
    order = {"delete": 0, "replace": 1, "create": 2, "update": 3}
    return sorted(changes.values(), key=lambda c: (not (c.loses or c.fails), order[c.action], c.type, c.name))


def _loud(c: Change, line: str) -> str:
    if c.fails:
        return (f"!! WILL FAIL: {line.strip()}\n     {c.fails} cannot change on a live object (the Kubernetes API "
                "refuses it, the provider patches it): `pulumi up` fails \"field is immutable\"; replace the "
                "object (replaceOnChanges) or delete it first")
    advice = "" if "WILL BE DELETED" in c.guard else "; set allowDataLoss only if the data may go"
    return f"!! DATA LOSS: {line.strip()}\n     destroys {c.loses}; {c.guard}{advice}"


def report(changes: list[Change]) -> list[str]:
    """The lines ``make diff`` prints: data loss and failing updates first, in capitals, then the rest."""
    lines = []
    for c in changes:
        line = f"  {c.action:<8} {c.type} {c.name}" + (f"  ({c.why})" if c.why else "")
        lines.append(_loud(c, line) if c.loses or c.fails else line)
    lost = sum(1 for c in changes if c.loses)
    failing = sum(1 for c in changes if c.fails)
    counts = {a: sum(1 for c in changes if c.action == a) for a in ("replace", "create", "delete", "update")}
    summary = ", ".join(f"{n} {a}" for a, n in counts.items() if n) or "no change"
    summary += f"; {lost} stateful resource(s) destroyed" if lost else ""
    summary += f"; {failing} update(s) the API server refuses" if failing else ""
    lines.append(summary)
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m infra.diff STACK key=value ...``: exit 1 when a stateful resource would be replaced or
    deleted, or an update would be refused."""
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
    for line in report(changes):
        print(line)
    return 1 if any(c.loses or c.fails for c in changes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
