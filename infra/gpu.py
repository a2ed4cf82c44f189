"""Where training pods run: spot GPU capacity, expressed as pod scheduling constraints.

- Autopilot + computeClass: a ComputeClass (spot first, on-demand only if ``onDemandFallback``);
  pods select it with ``cloud.google.com/compute-class`` and nothing else (a hard gke-spot selector
  next to a compute class would defeat the fallback).
- Autopilot + nodeSelector: pods select ``gke-spot``, the accelerator and the ``latest`` GPU driver directly.
- Standard: the same selectors land pods on the spot GPU node pool; they tolerate its taint.
- trainOn=cpu (Autopilot only): pods select ``gke-spot`` and nothing else: Spot Pods without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import GpuConfig
from infra.gke import ACCELERATOR_LABEL, COMPUTE_CLASS_LABEL, GPU_DRIVER_LABEL, GPU_RESOURCE, SPOT_LABEL


@dataclass(frozen=True)
class GpuArgs:
    """The GPUs' slice of the stack, and the cluster's mode (Autopilot: pods ask; Standard: the spot pool)."""

    gpu: GpuConfig
    autopilot: bool


class GpuCapacity(pulumi.ComponentResource):
    """``node_selector`` and ``tolerations`` for training pods, and what they must wait for."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    resources: list[pulumi.Resource]

    def __init__(
        self, name: str, args: GpuArgs, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:GpuCapacity", name, None, opts)
        gpu, autopilot = args.gpu, args.autopilot
        # Tolerated everywhere: the Standard pool's spot taint and GKE's GPU taint; harmless on Autopilot.
        self.tolerations = [
            {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ]
        self.resources = []
        if gpu.on_cpu:  # trainOn=cpu (Autopilot only, infra.config): Spot Pods on the general-purpose class
            # A Spot Pod is asked for with this selector alone; GKE adds the toleration of its spot nodes' taint
            # (cloud.google.com/kubernetes-engine/docs/how-to/autopilot-spot-pods: "Request Spot Pods").
            self.tolerations = self.tolerations[:1]
            self.node_selector = {SPOT_LABEL: "true"}
        elif autopilot and gpu.capacity == "computeClass":
            class_name = f"{contract.APP}-gpu"
            priorities: list[dict[str, Any]] = [
                {"gpu": {"type": gpu.type, "count": gpu.count, "driverVersion": "latest"}, "spot": True}
            ]
            if gpu.on_demand_fallback:
                priorities.append(
                    {"gpu": {"type": gpu.type, "count": gpu.count, "driverVersion": "latest"}, "spot": False}
                )
            compute_class = k8s.apiextensions.CustomResource(
                name,
                api_version="cloud.google.com/v1",
                kind="ComputeClass",
                metadata={"name": class_name, "labels": {contract.NAME_LABEL: contract.APP}},
                spec={
                    "priorities": priorities,
                    # Move pods back to spot when it returns (only matters with the fallback).
                    "activeMigration": {"optimizeRulePriority": gpu.on_demand_fallback},
                    # Never scale up outside the priorities: no silent on-demand spend.
                    "whenUnsatisfiable": "DoNotScaleUp",
                    "nodePoolAutoCreation": {"enabled": True},
                },
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
            self.resources.append(compute_class)
            self.node_selector = {COMPUTE_CLASS_LABEL: class_name}
        else:
            self.node_selector = {SPOT_LABEL: "true", ACCELERATOR_LABEL: gpu.type}
            if autopilot:
                # Standard pools install LATEST themselves (gpu_driver_installation_config).
                self.node_selector[GPU_DRIVER_LABEL] = "latest"
        self.register_outputs({"node_selector": self.node_selector})
