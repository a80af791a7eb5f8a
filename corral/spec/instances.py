"""Cloud instance types and the GPUs they carry, so a SkyPilot file that names a machine
(``instance_type: p4d.24xlarge``) instead of its accelerators asks here for what that machine
would have given it. A GPU instance type that is not in this table is refused with a sentence
rather than run without GPUs: a job must never lose its GPUs silently.

The names are the clouds' public ones (AWS, GCP, Azure, Lambda) and the accelerator names are
SkyPilot's (``A100-80GB``, ``H100``), which is what a pool's ``gpu_type`` is matched against."""

from __future__ import annotations

import re

# instance type -> (accelerator, count per machine)
GPU_INSTANCES: dict[str, tuple[str, int]] = {
    # AWS
    "p3.2xlarge": ("V100", 1), "p3.8xlarge": ("V100", 4), "p3.16xlarge": ("V100", 8),
    "p3dn.24xlarge": ("V100-32GB", 8),
    "p4d.24xlarge": ("A100", 8), "p4de.24xlarge": ("A100-80GB", 8),
    "p5.48xlarge": ("H100", 8), "p5e.48xlarge": ("H200", 8), "p5en.48xlarge": ("H200", 8),
    "p6-b200.48xlarge": ("B200", 8),
    "g4dn.xlarge": ("T4", 1), "g4dn.2xlarge": ("T4", 1), "g4dn.4xlarge": ("T4", 1), "g4dn.8xlarge": ("T4", 1),
    "g4dn.16xlarge": ("T4", 1), "g4dn.12xlarge": ("T4", 4), "g4dn.metal": ("T4", 8),
    "g5.xlarge": ("A10G", 1), "g5.2xlarge": ("A10G", 1), "g5.4xlarge": ("A10G", 1), "g5.8xlarge": ("A10G", 1),
    "g5.16xlarge": ("A10G", 1), "g5.12xlarge": ("A10G", 4), "g5.24xlarge": ("A10G", 4), "g5.48xlarge": ("A10G", 8),
    "g6.xlarge": ("L4", 1), "g6.2xlarge": ("L4", 1), "g6.4xlarge": ("L4", 1), "g6.8xlarge": ("L4", 1),
    "g6.16xlarge": ("L4", 1), "g6.12xlarge": ("L4", 4), "g6.24xlarge": ("L4", 4), "g6.48xlarge": ("L4", 8),
    "g6e.xlarge": ("L40S", 1), "g6e.2xlarge": ("L40S", 1), "g6e.4xlarge": ("L40S", 1), "g6e.8xlarge": ("L40S", 1),
    "g6e.16xlarge": ("L40S", 1), "g6e.12xlarge": ("L40S", 4), "g6e.24xlarge": ("L40S", 4),
    "g6e.48xlarge": ("L40S", 8),
    # GCP
    "a2-highgpu-1g": ("A100", 1), "a2-highgpu-2g": ("A100", 2), "a2-highgpu-4g": ("A100", 4),
    "a2-highgpu-8g": ("A100", 8), "a2-megagpu-16g": ("A100", 16),
    "a2-ultragpu-1g": ("A100-80GB", 1), "a2-ultragpu-2g": ("A100-80GB", 2), "a2-ultragpu-4g": ("A100-80GB", 4),
    "a2-ultragpu-8g": ("A100-80GB", 8),
    "a3-highgpu-1g": ("H100", 1), "a3-highgpu-2g": ("H100", 2), "a3-highgpu-4g": ("H100", 4),
    "a3-highgpu-8g": ("H100", 8), "a3-megagpu-8g": ("H100-MEGA", 8), "a3-ultragpu-8g": ("H200", 8),
    "a4-highgpu-8g": ("B200", 8),
    "g2-standard-4": ("L4", 1), "g2-standard-8": ("L4", 1), "g2-standard-12": ("L4", 1),
    "g2-standard-16": ("L4", 1), "g2-standard-32": ("L4", 1), "g2-standard-24": ("L4", 2),
    "g2-standard-48": ("L4", 4), "g2-standard-96": ("L4", 8),
    # Azure
    "Standard_NC6s_v3": ("V100", 1), "Standard_NC12s_v3": ("V100", 2), "Standard_NC24s_v3": ("V100", 4),
    "Standard_ND40rs_v2": ("V100-32GB", 8),
    "Standard_NC24ads_A100_v4": ("A100-80GB", 1), "Standard_NC48ads_A100_v4": ("A100-80GB", 2),
    "Standard_NC96ads_A100_v4": ("A100-80GB", 4),
    "Standard_ND96asr_v4": ("A100", 8), "Standard_ND96amsr_A100_v4": ("A100-80GB", 8),
    "Standard_ND96isr_H100_v5": ("H100", 8), "Standard_ND96isr_H200_v5": ("H200", 8),
    # Lambda
    "gpu_1x_a10": ("A10", 1), "gpu_1x_a100": ("A100", 1), "gpu_1x_a100_sxm4": ("A100", 1),
    "gpu_2x_a100": ("A100", 2), "gpu_4x_a100": ("A100", 4), "gpu_8x_a100": ("A100", 8),
    "gpu_8x_a100_80gb_sxm4": ("A100-80GB", 8), "gpu_1x_h100_pcie": ("H100", 1), "gpu_1x_h100_sxm5": ("H100", 1),
    "gpu_2x_h100_sxm5": ("H100", 2), "gpu_4x_h100_sxm5": ("H100", 4), "gpu_8x_h100_sxm5": ("H100", 8),
    "gpu_1x_gh200": ("GH200", 1), "gpu_8x_b200_sxm6": ("B200", 8),
}

# Families whose every member carries GPUs: an unknown member is refused, never run GPU-less.
_GPU_FAMILY = re.compile(r"^(p\d|g\d|a\d-|g2-|Standard_N[CDV]|gpu_)", re.IGNORECASE)


def gpus_of(instance_type: str) -> tuple[str, int] | None:
    """The (accelerator, count) an instance type carries; None for a machine without GPUs.
    Raises ValueError for a GPU machine this table does not know."""
    found = GPU_INSTANCES.get(instance_type)
    if found is None:
        found = next((v for k, v in GPU_INSTANCES.items() if k.lower() == instance_type.lower()), None)
    if found is not None:
        return found
    if _GPU_FAMILY.match(instance_type):
        raise ValueError(f"instance_type {instance_type!r} is a GPU machine corral does not know the GPUs of; "
                         "say what it needs with resources.accelerators (e.g. A100:8) instead")
    return None
