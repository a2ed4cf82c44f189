"""GKE's own names for spot capacity and GPUs: one place, read by the program and the policy pack.

Plain constants (no Pulumi imports) so that ``policy/`` can check what ``infra/`` declares with the
same spelling, inside the policy pack's small virtualenv.
"""

from __future__ import annotations

# GKE labels spot nodes with this, and the Standard spot pool carries it as a taint (GKE's convention).
SPOT_LABEL = "cloud.google.com/gke-spot"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
COMPUTE_CLASS_LABEL = "cloud.google.com/compute-class"
GPU_RESOURCE = "nvidia.com/gpu"
# Autopilot installs the GPU driver this label asks for ("default" or "latest"); the CUDA build of torch
# needs a recent driver, so the nodeSelector path asks for "latest" (compute classes set driverVersion).
GPU_DRIVER_LABEL = "cloud.google.com/gke-gpu-driver-version"
ZONE_LABEL = "topology.kubernetes.io/zone"
