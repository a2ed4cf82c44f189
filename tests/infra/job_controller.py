"""How the Kubernetes Job controller judges failed pods, for a rendered Job spec.

The rules, from the Job documentation ("Pod failure policy", "Pod backoff failure policy"; GA in 1.31):
rules are tried in order and the first that matches a failed pod decides; ``onExitCodes`` looks at the
containers (only ``containerName`` when given) that exited non-zero, ``In`` matching when one of their
codes is listed and ``NotIn`` when one is not; ``onPodConditions`` matches a pod condition of that type
and status. ``FailJob`` ends the Job with reason ``PodFailurePolicy``, ``Ignore`` retries without counting,
``Count`` (and no matching rule) counts against ``backoffLimit``; a Job whose counted failures exceed
``backoffLimit`` fails with ``BackoffLimitExceeded``, one past ``activeDeadlineSeconds`` with
``DeadlineExceeded``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FailedPod:
    exit_codes: dict[str, int]  # container name -> exit code
    conditions: tuple[str, ...] = ()  # pod condition types with status True (e.g. DisruptionTarget)


@dataclass
class JobController:
    spec: dict[str, Any]
    counted: int = 0
    ignored: int = 0
    reason: str | None = None  # the Failed condition's reason, once the Job failed
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        """What the API server refuses in a podFailurePolicy (kubernetes pkg/apis/batch/validation/
        validation.go: supportedPodFailurePolicyActions, ...OnExitCodesOperator, ...OnPodConditionsStatus):
        such a Job is never created, so no judgement below would ever apply to it."""
        for rule in (self.spec.get("podFailurePolicy") or {}).get("rules", []):
            assert rule["action"] in ("Count", "FailIndex", "FailJob", "Ignore"), rule
            if "onExitCodes" in rule:
                assert rule["onExitCodes"]["operator"] in ("In", "NotIn"), rule
            for condition in rule.get("onPodConditions", []):
                assert condition.get("status", "True") in ("True", "False", "Unknown"), rule

    def _matches(self, rule: dict[str, Any], pod: FailedPod) -> bool:
        if "onPodConditions" in rule:
            wanted = rule["onPodConditions"]
            return any(c["type"] in pod.conditions and c.get("status", "True") == "True" for c in wanted)
        codes = rule["onExitCodes"]
        name = codes.get("containerName")
        exits = [code for c, code in pod.exit_codes.items() if code != 0 and (name is None or c == name)]
        if codes["operator"] == "In":
            return any(code in codes["values"] for code in exits)
        return any(code not in codes["values"] for code in exits)

    def pod_failed(self, pod: FailedPod) -> str | None:
        """Judge one failed pod; returns the Job's failure reason once it has failed, else None."""
        if self.reason:
            raise AssertionError("the Job already failed: it creates no more pods")
        rules = (self.spec.get("podFailurePolicy") or {}).get("rules", [])
        action = next((r["action"] for r in rules if self._matches(r, pod)), "Count")
        self.log.append(action)
        if action == "FailJob":
            self.reason = "PodFailurePolicy"
        elif action == "Ignore":
            self.ignored += 1
        else:
            self.counted += 1
            if self.counted > self.spec.get("backoffLimit", 6):
                self.reason = "BackoffLimitExceeded"
        return self.reason

    def deadline_passed(self) -> str | None:
        if not self.reason and self.spec.get("activeDeadlineSeconds") is not None:
            self.reason = "DeadlineExceeded"
        return self.reason
