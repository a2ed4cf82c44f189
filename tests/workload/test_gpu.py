"""GPU or fail: a pod given a GPU that CUDA cannot use exits at once, saying which driver it saw and what
the image needs, and takes no item; on a machine with a GPU the worker trains on CUDA.

These machines have no GPU: a GPU-limited pod is simulated the way the runtime shows one to the
container (EXPECTED_GPUS from the Job, NVIDIA_VISIBLE_DEVICES, device files) around the CPU build of
torch, which is exactly "the driver/toolkit cannot serve this pod".
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch

from infra import contract
from tests.workload.harness import Cluster
from workload.core import errors
from workload.model.trainer import default_device
from workload.runtime import gpu

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a GPU pod without CUDA")
R570 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 07:25:22 UTC 2025\n"


@pytest.fixture
def r570(tmp_path: Path) -> Path:
    path = tmp_path / "version"
    path.write_text(R570 + "GCC version:  gcc version 12.2.0\n")
    return path


def test_a_pod_without_a_gpu_is_left_to_the_cpu(r570: Path) -> None:
    assert gpu.unusable_reason({}, [], r570) == ""
    assert gpu.unusable_reason({"NVIDIA_VISIBLE_DEVICES": "void", "EXPECTED_GPUS": "0"}, [], r570) == ""


@NO_CUDA
@pytest.mark.parametrize(("environ", "devices", "evidence", "wanted"), [
    ({"EXPECTED_GPUS": "2"}, [], "EXPECTED_GPUS=2", 2),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-3f2a"}, [], "NVIDIA_VISIBLE_DEVICES=GPU-3f2a", 1),
    ({}, ["/dev/nvidia0"], "GPU devices /dev/nvidia0", 1),
    ({"EXPECTED_GPUS": " 1 "}, ["/dev/nvidia0", "/dev/nvidia1"], "EXPECTED_GPUS=1", 1),
    ({}, ["/dev/nvidia0", "/dev/nvidia1"], "GPU devices /dev/nvidia0, /dev/nvidia1", 1),
])
def test_a_gpu_pod_without_cuda_names_the_driver_and_what_the_image_needs(
    environ: dict[str, str], devices: list[str], evidence: str, wanted: int, r570: Path
) -> None:
    reason = gpu.unusable_reason(environ, devices, r570)
    assert reason == (
        f"this pod was given a GPU ({evidence}) but CUDA sees 0 of {wanted}: NVIDIA driver 570.133.20; "
        f"torch {torch.__version__} needs a CUDA build of torch, but this image has a CPU-only one. Refusing to "
        "train on the CPU (rebuild the image for the node's driver, or pin the driver: docs/cloud.md#gpu-driver)")


@NO_CUDA
def test_without_arguments_the_check_reads_this_process_and_this_machine(
        monkeypatch: pytest.MonkeyPatch, r570: Path) -> None:
    """The worker calls it bare: the environment and device files of its own pod."""
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("EXPECTED_GPUS", "3")
    assert gpu.unusable_reason(version_file=r570).startswith(
        "this pod was given a GPU (EXPECTED_GPUS=3) but CUDA sees 0 of 3: NVIDIA driver 570.133.20;")
    monkeypatch.delenv("EXPECTED_GPUS")
    devices = sorted(glob.glob(gpu.DEVICE_FILES))  # none on these machines: a pod holding no GPU
    assert gpu.unusable_reason(version_file=r570) == (
        "" if not devices else gpu.unusable_reason({}, devices, r570))


def test_the_driver_is_read_from_the_kernel_module_or_named_missing(tmp_path: Path, r570: Path) -> None:
    assert gpu.driver_version(r570) == "570.133.20"
    assert gpu.driver_version(tmp_path / "absent") == f"none loaded ({tmp_path / 'absent'} is missing)"
    assert gpu.CUDA_MIN_DRIVER["13"] == "R580" and gpu.CUDA_MIN_DRIVER["12"] == "R525"
    odd = tmp_path / "odd"
    odd.write_bytes(R570.encode().replace(b"UNIX", b"UN\xffX"))  # a byte that is no UTF-8: still read
    assert gpu.driver_version(odd) == "570.133.20"
    odd.write_text("  NVRM version: " + "x" * 100 + "\n")
    assert gpu.driver_version(odd) == f"unknown ({odd} says {('NVRM version: ' + 'x' * 100)[:80]!r})"


@NO_CUDA
def test_the_worker_of_a_gpu_pod_without_cuda_exits_6_at_once_and_takes_nothing(cluster: Cluster) -> None:
    cluster.seed()
    before = cluster.counts()
    proc = cluster.start_worker("gpu-pod", **{contract.ENV_EXPECTED_GPUS: "1"})
    assert proc.wait(120) == errors.EXIT_GPU_UNUSABLE
    (line,) = [x for x in cluster.log("gpu-pod").splitlines() if x.strip()]
    assert line.startswith("error: this pod was given a GPU (EXPECTED_GPUS=1) but CUDA sees 0 of 1")
    assert cluster.counts() == before  # nothing claimed, no attempt spent
    assert not (cluster.share / "output").exists() or not any((cluster.share / "output").iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs on the device machine)")
def test_on_a_gpu_the_worker_trains_on_cuda(cluster: Cluster) -> None:
    assert gpu.unusable_reason({contract.ENV_EXPECTED_GPUS: "1"}) == ""
    assert default_device().type == "cuda"
    cluster.seed()
    proc = cluster.start_worker("gpu-pod", **{contract.ENV_EXPECTED_GPUS: "1"})
    assert proc.wait(300) == 0, cluster.log("gpu-pod")
    assert cluster.final_state()["applied"]


def test_a_gpu_pod_imports_the_pictures_library_while_it_trains_and_a_cpu_pod_leaves_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from workload.runtime.worker import preload_pictures

    monkeypatch.delitem(sys.modules, "workload.model.plots", raising=False)
    assert preload_pictures(torch.device("cpu")) is None
    assert "workload.model.plots" not in sys.modules
    thread = preload_pictures(torch.device("cuda"))  # a device named, not used: nothing here touches CUDA
    assert thread is not None and not thread.daemon  # an exit waits for the import, never tears it down
    thread.join(120)
    assert not thread.is_alive() and "workload.model.plots" in sys.modules
