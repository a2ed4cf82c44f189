"""The Pod Security Standards' checks that a pod spec of this program can meet or miss, as the
admission controller applies them (kubernetes.io/docs/concepts/security/pod-security-standards/).

What the namespace label ``pod-security.kubernetes.io/enforce`` admits, so a test can show that the
share preparation needs its own ``baseline`` namespace and that everything else passes ``restricted``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
LEVELS = ("privileged", "baseline", "restricted")


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key, [])


def pod_security_violations(pod: dict[str, Any], level: str) -> list[str]:
    """What keeps ``pod`` (a pod spec) out of a namespace enforcing ``level``; empty when admitted."""
    if level not in LEVELS:
        raise ValueError(level)
    found: list[str] = []
    if level == "privileged":
        return found
    pod_ctx = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"{key} is true")
    for volume in pod.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind == "hostPath":
            found.append(f"volume {volume['name']!r} is a hostPath")
        elif level == "restricted" and kind not in RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']!r} is of type {kind}")
    if pod_ctx.get("seccompProfile", {}).get("type") == "Unconfined":
        found.append("pod seccomp profile is Unconfined")
    if level == "restricted":
        # A pod-level value the containers override still refuses the pod (pod-security-admission's
        # check_runAsNonRoot.go and check_seccompProfile_restricted.go: "pod must not set
        # securityContext.runAsNonRoot=false"; a pod-level seccompProfile.type other than RuntimeDefault or
        # Localhost is a bad setter). It also reaches containers added later without their own, like
        # `kubectl debug`'s ephemeral ones.
        if pod_ctx.get("runAsNonRoot") is False:
            found.append("pod sets runAsNonRoot false")
        if "seccompProfile" in pod_ctx and pod_ctx["seccompProfile"].get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"pod seccomp profile is {pod_ctx['seccompProfile'].get('type')!r}")
    for c in _containers(pod):
        ctx = c.get("securityContext", {})
        name = c["name"]
        caps = ctx.get("capabilities", {})
        if ctx.get("privileged"):
            found.append(f"container {name!r} is privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"container {name!r} uses a hostPort")
        extra = set(caps.get("add", [])) - BASELINE_CAPABILITIES
        if extra:
            found.append(f"container {name!r} adds {sorted(extra)}")
        if level != "restricted":
            continue
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name!r} allows privilege escalation")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            found.append(f"container {name!r} does not set runAsNonRoot")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"container {name!r} runs as uid 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"container {name!r} has seccomp profile {seccomp!r}")
        if "ALL" not in caps.get("drop", []):
            found.append(f"container {name!r} does not drop ALL capabilities")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"container {name!r} adds {sorted(caps['add'])}")
    return found
