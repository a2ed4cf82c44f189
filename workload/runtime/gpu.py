"""GPU or fail: a worker that was given a GPU trains on it, or exits at once saying why.

The trainer picks CUDA when ``torch.cuda.is_available()`` and the CPU otherwise, which is right on a
laptop and silently wrong on a spot GPU node: a torch build for a newer CUDA than the node's driver
(torch from PyPI is a CUDA 13 build, which needs driver R580; GKE's ``LATEST`` COS driver has been an
R570 branch) reports no CUDA, and every GPU is paid for and idle. So before the first claim the worker
asks: was this pod given a GPU? If so and CUDA cannot use it, it exits ``EXIT_GPU_UNUSABLE`` with one
line naming the driver seen and the CUDA the image needs; the Jobs fail on that code (not retried).

A pod "was given a GPU" when the Job says so (``EXPECTED_GPUS``, set by infra from the pod's
``nvidia.com/gpu`` limit, which the downward API cannot expose), when the container runtime exposes
devices (``NVIDIA_VISIBLE_DEVICES``), or when GPU device files exist (GKE's device plugin mounts
``/dev/nvidia<N>``).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from pathlib import Path

ENV_EXPECTED_GPUS = "EXPECTED_GPUS"
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEVICE_FILES = "/dev/nvidia[0-9]*"
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
# NVIDIA_VISIBLE_DEVICES values that mean "no GPU" (the NVIDIA container runtime's own words).
NO_DEVICES = frozenset({"", "void", "none"})
# The oldest driver branch each CUDA major line runs on (NVIDIA's CUDA compatibility guide: 12.x runs on
# R525+ through minor-version compatibility, 13.x needs R580+).
CUDA_MIN_DRIVER = {"11": "R450", "12": "R525", "13": "R580"}
_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+(?:\.[0-9]+)+)")


def assigned_gpus(environ: Mapping[str, str], device_files: list[str]) -> str:
    """Why this pod holds a GPU ('' when it holds none): the evidence, for the error line."""
    expected = environ.get(ENV_EXPECTED_GPUS, "").strip()
    if expected not in ("", "0"):
        return f"{ENV_EXPECTED_GPUS}={expected}"
    visible = environ.get(ENV_VISIBLE_DEVICES)
    if visible is not None and visible.strip().lower() not in NO_DEVICES:
        return f"{ENV_VISIBLE_DEVICES}={visible}"
    if device_files:
        return "GPU devices " + ", ".join(device_files)
    return ""


def driver_version(version_file: Path = DRIVER_VERSION_FILE) -> str:
    """The loaded NVIDIA kernel driver's version, or a phrase saying there is none."""
    try:
        text = version_file.read_text(errors="replace")
    except OSError:
        return f"none loaded ({version_file} is missing)"
    found = _DRIVER.search(text)
    return found[1] if found else f"unknown ({version_file} says {text.strip()[:80]!r})"


def unusable_reason(
    environ: Mapping[str, str] | None = None,
    device_files: list[str] | None = None,
    version_file: Path = DRIVER_VERSION_FILE,
) -> str:
    """One line saying why this GPU pod cannot train on CUDA, or '' when it can (or holds no GPU)."""
    environ = os.environ if environ is None else environ
    device_files = sorted(glob.glob(DEVICE_FILES)) if device_files is None else device_files
    given = assigned_gpus(environ, device_files)
    if not given:
        return ""
    import torch  # only a pod that holds a GPU pays for the import here

    expected = environ.get(ENV_EXPECTED_GPUS, "").strip()
    wanted = max(1, int(expected)) if expected.isdigit() else 1
    if torch.cuda.is_available() and torch.cuda.device_count() >= wanted:
        return ""
    cuda = torch.version.cuda
    needs = (
        f"CUDA {cuda} (driver {CUDA_MIN_DRIVER.get(cuda.split('.')[0], 'for it')} or newer)"
        if cuda else "a CUDA build of torch, but this image has a CPU-only one"
    )
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return (
        f"this pod was given a GPU ({given}) but CUDA sees {seen} of {wanted}: NVIDIA driver "
        f"{driver_version(version_file)}; torch {torch.__version__} needs {needs}. Refusing to train on the CPU "
        "(rebuild the image for the node's driver, or pin the driver: docs/cloud.md#gpu-driver)"
    )
