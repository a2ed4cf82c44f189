"""The rules of ``policy.rules`` as pulumi-policy policies, with the stack facts read from the engine.

Kept apart from ``__main__.py`` because constructing ``PolicyPack`` starts the analyzer server and
never returns: tests build the policies from here and inspect them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi_policy import (
    EnforcementLevel,
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra import contract
from infra.config import DATA_LOSS_KEY, PROJECT
from policy import rules

NAME = "spot-trainer-guardrails"
LEVELS = {rules.MANDATORY: EnforcementLevel.MANDATORY, rules.ADVISORY: EnforcementLevel.ADVISORY}


def stack_of(urn: str) -> str:
    """The stack named in a URN (``urn:pulumi:<stack>::<project>::<type>::<name>``): the deletion rule
    must not depend on whether the engine also exported ``PULUMI_STACK`` to the pack."""
    return urn.split("::", 1)[0].rsplit(":", 1)[-1]


def stack_facts(config: Mapping[str, Any] | None = None, stack: str | None = None) -> rules.StackFacts:
    """Stack name and config as the engine passes them to the pack (the URN, ``PULUMI_CONFIG``).

    Pulumi.yaml defaults may not be among them, so a missing ``team`` is checked for presence only and
    a missing ``env`` means the stack name, as in ``infra.config``.
    """
    stack = stack if stack is not None else pulumi.get_stack()
    if config is None:
        cfg = pulumi.Config(PROJECT)
        keys = ("env", "team", "onDemandFallback", "datasetUri", "outputUri", DATA_LOSS_KEY)
        config = {k: cfg.get(k) for k in keys}
    return rules.StackFacts(
        stack=stack,
        on_demand_fallback=str(config.get("onDemandFallback") or "false").lower() == "true",
        labels={"env": config.get("env") or stack, "app": contract.APP, "team": config.get("team") or None},
        dataset_uri=str(config.get("datasetUri") or "").strip().rstrip("/"),
        output_uri=str(config.get("outputUri") or "").strip().rstrip("/"),
        allow_data_loss=str(config.get(DATA_LOSS_KEY) or "false").lower() == "true",
    )


def _resource_policy(rule: rules.Rule) -> ResourceValidationPolicy:
    check = rule.check_resource
    assert check is not None

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        facts = stack_facts(stack=stack_of(args.urn))
        if rule.reads_protect:
            messages = check(args.resource_type, args.props, facts, protect=bool(getattr(args.opts, "protect", False)))
        else:
            messages = check(args.resource_type, args.props, facts)
        for message in messages:
            report(message, None)

    return ResourceValidationPolicy(rule.name, rule.description, validate, LEVELS[rule.level])


def _stack_policy(rule: rules.Rule) -> StackValidationPolicy:
    check = rule.check_stack
    assert check is not None

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [rules.Resource(r.resource_type, r.name, r.urn, r.props) for r in args.resources]
        facts = stack_facts(stack=stack_of(resources[0].urn) if resources else None)
        for urn, message in check(resources, facts):
            report(message, urn)

    return StackValidationPolicy(rule.name, rule.description, validate, LEVELS[rule.level])


def policies() -> list[Policy]:
    """One pulumi-policy policy per rule, at the rule's enforcement level."""
    return [_stack_policy(r) if r.check_stack else _resource_policy(r) for r in rules.RULES]
