"""What accelerators this host has, read from the operating system before any framework
starts, and what each TPU generation's chip and each GPU Kaggle and Colab lend offer
(framework-free): both sides decide their runtime set-up from the first; preflight's targets
and the loop's model-FLOPs utilisation read the second.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

_GOOGLE_PCI_VENDOR = "0x1ae0"


def has_tpu() -> bool:
    """A TPU chip on this host: a Google PCI device, or the TPU driver's device files
    (/dev/accel* on v2-v4, /dev/vfio/N on v5 and later)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == _GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


GiB = 2**30


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation's chip, from Google's Cloud TPU system-architecture pages
    (cloud.google.com/tpu/docs/v2, v3, v4, v5e, v6e): the one table of these facts; preflight's
    targets, the loop's MFU and the docs' target table read it.

    HBM is in GiB: HBM stacks are sized in powers of two, and the v5e and v6e pages' "16 GB" and
    "32 GB" are the same binary capacities the older pages write as GiB."""

    device_kind: str  # what JAX reports as a device's `device_kind`
    hbm_gib: float  # per chip
    bf16_tflops: float  # peak, per chip
    hbm_gbps: float  # per chip, 1e9 bytes/s
    devices_per_chip: int  # JAX devices per chip on a TPU VM (v2/v3: one per TensorCore)
    source: str
    # Whether libtpu's cost model gives usable step times for this generation on a host
    # without a TPU (preflight's estimate): for v4, v5e and v6e it returns negative
    # `optimal_seconds` for real models (docs/tpu.md), so a positive one is luck, not a figure.
    cost_model: bool = False

    def per_device(self, chips: int = 1, devices: int | None = None) -> tuple[float, float, float]:
        """(HBM bytes, bf16 peak FLOP/s, HBM bytes/s) of one of `devices` JAX devices over
        `chips` chips (default: one chip's own devices on a TPU VM)."""
        devices = devices or chips * self.devices_per_chip
        share = chips / devices
        return (
            self.hbm_gib * GiB * share,
            self.bf16_tflops * 1e12 * share,
            self.hbm_gbps * 1e9 * share,
        )


TPU_CHIPS: dict[str, TpuChip] = {
    "v2": TpuChip("TPU v2", 16, 45, 700, 2, "cloud.google.com/tpu/docs/v2", cost_model=True),
    "v3": TpuChip("TPU v3", 32, 123, 900, 2, "cloud.google.com/tpu/docs/v3", cost_model=True),
    "v4": TpuChip("TPU v4", 32, 275, 1200, 1, "cloud.google.com/tpu/docs/v4"),
    "v5e": TpuChip("TPU v5 lite", 16, 197, 819, 1, "cloud.google.com/tpu/docs/v5e"),
    # v5p's page writes "95 GB" of HBM2e (not a power of two): taken as written
    "v5p": TpuChip("TPU v5", 95, 459, 2765, 1, "cloud.google.com/tpu/docs/v5p"),
    "v6e": TpuChip("TPU v6 lite", 32, 918, 1640, 1, "cloud.google.com/tpu/docs/v6e"),
}


def peak_flops_per_device(device_kind: str) -> float | None:
    """The bf16 peak FLOP/s of one JAX device of this kind on a TPU VM (None where it is not
    known: CPUs, GPUs, other TPU generations), for the model-FLOPs utilisation."""
    for chip in TPU_CHIPS.values():
        if chip.device_kind == device_kind:
            return chip.per_device()[1]
    return None


@dataclass(frozen=True)
class GpuChip:
    """One NVIDIA GPU Kaggle or Colab lends, from NVIDIA's product datasheets (`source`): the
    one table of these facts; preflight's GPU targets read it. Peaks are dense (without
    structured sparsity), per GPU; `fp16_tflops` is the tensor-core rate with fp32
    accumulation where the chip has tensor cores (the P100 has none: its fp16 rate)."""

    device_kind: str  # what JAX reports as the device's `device_kind`
    memory_gib: float  # the datasheet's, in GiB (the driver reports a little less)
    fp32_tflops: float
    fp16_tflops: float
    bf16_tflops: float  # 0: no bfloat16 (compute capability below 8.0)
    memory_gbps: float  # 1e9 bytes/s
    compute_capability: str
    source: str

    def peak_tflops(self, precision: str) -> float:
        """The peak for a run's --precision (bf16 on a chip without it: 0)."""
        return {"fp32": self.fp32_tflops, "fp16": self.fp16_tflops, "bf16": self.bf16_tflops}[
            precision
        ]


GPU_CHIPS: dict[str, GpuChip] = {
    "t4": GpuChip("Tesla T4", 16, 8.1, 65, 0, 320, "7.5", "NVIDIA T4 datasheet"),
    "p100": GpuChip(
        "Tesla P100-PCIE-16GB", 16, 9.3, 18.7, 0, 732, "6.0", "NVIDIA Tesla P100 datasheet (PCIe)"
    ),
    "l4": GpuChip("NVIDIA L4", 24, 30.3, 121, 121, 300, "8.9", "NVIDIA L4 datasheet"),
    "a100-40": GpuChip(
        "NVIDIA A100-SXM4-40GB", 40, 19.5, 312, 312, 1555, "8.0", "NVIDIA A100 datasheet (SXM)"
    ),
    "a100-80": GpuChip(
        "NVIDIA A100-SXM4-80GB", 80, 19.5, 312, 312, 2039, "8.0", "NVIDIA A100 datasheet (SXM)"
    ),
    "h100": GpuChip(
        "NVIDIA H100 80GB HBM3", 80, 67, 989, 989, 3350, "9.0", "NVIDIA H100 datasheet (SXM)"
    ),
}


# NVIDIA GPUs compute in bfloat16 from compute capability 8.0 (Ampere: A100, L4, H100); a T4
# (7.5), V100 (7.0) or P100 (6.0) has fp16 only (NVIDIA's CUDA C++ programming guide,
# "Arithmetic Instructions" by compute capability).
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)


# JAX multiplies fp32 matrices on an NVIDIA GPU in TF32 by default (10 bits of mantissa, on
# the tensor cores of compute capability 8.0 and up), where torch keeps fp32
# (`torch.backends.cuda.matmul.allow_tf32` is off by default). So `--precision fp32` on a GPU
# asks JAX for full-precision matmuls: measured by `benchmarks.training.device_check` on an H200
# (MiniLM, 16 comments, against torch on the same GPU), JAX's default gave gradients 1.6e-3 apart
# (the fp32 bound is 1e-3) and "highest" 2.4e-6, logits 2.6e-5 and 3.6e-8. TPUs keep their
# default (one bf16 pass, as torch_xla's own default); bf16 and fp16 matmuls are not changed by
# it. A user's JAX_DEFAULT_MATMUL_PRECISION (e.g. "tensorfloat32" for TF32's speed) is kept.
MATMUL_PRECISION_ENV = "JAX_DEFAULT_MATMUL_PRECISION"


def matmul_precision(platform: str, environ: dict[str, str]) -> str | None:
    """The default matmul precision a process on `platform` should set: 'highest' on a GPU
    unless `environ` names one (then None: JAX reads it itself); None elsewhere."""
    if platform in ("gpu", "cuda") and MATMUL_PRECISION_ENV not in environ:
        return "highest"
    return None


def precision_problem(
    precision: str, platform: str, compute_capability: str | None = None
) -> tuple[str, str] | None:
    """What is wrong with training in `precision` on a device of `platform` ('cpu', 'gpu' or
    'cuda', 'tpu'; a GPU's `compute_capability` such as '7.5'): ('error', why) for bf16 on a
    GPU without bfloat16, ('warning', why) for fp16 off a GPU, None when it fits."""
    gpu = platform in ("gpu", "cuda")
    if precision == "bf16" and gpu and compute_capability:
        major, minor = (int(x) for x in compute_capability.split(".")[:2])
        if (major, minor) < BF16_MIN_COMPUTE_CAPABILITY:
            return (
                "error",
                f"--precision bf16: this GPU (compute capability {compute_capability}) has no "
                "bfloat16; use --precision fp16 (with loss scaling) or fp32",
            )
    if precision == "fp16" and platform == "cpu":
        return (
            "warning",
            "--precision fp16 on the CPU: fp16 with loss scaling is for GPUs without bfloat16 "
            "(T4, P100); here it runs, for parity checks, no faster than fp32 (measured in "
            "docs/gpu.md); bf16 or fp32 train faster",
        )
    if precision == "fp16" and not gpu:
        return (
            "warning",
            f"--precision fp16 on {platform.upper()}: fp16 with loss scaling is for GPUs "
            "without bfloat16 (T4, P100); this device computes bf16 (--precision bf16)",
        )
    return None


# Scoring on a CPU: XLA:CPU computes bf16 (and fp16) natively only where the CPU has the
# instructions (AVX-512 BF16 or AMX; AVX-512 FP16), and emulates them elsewhere, slower than
# fp32 (issue 89: a lone request to a bf16 run's server took 0.6-1.2 s on a 2-core AVX2
# machine). `JAXTPU_SCORE_PRECISION` chooses: auto (the default, this rule), fp32 (always
# upcast a bf16 or fp16 run), run (always the run's own precision).
SCORE_PRECISION_ENV = "JAXTPU_SCORE_PRECISION"
_NATIVE = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (`cpuinfo`: the text of /proc/cpuinfo; read when None; empty
    where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.split(":", 1)[1].split())
    return set()


def scoring_precision(
    precision: str, platform: str, choice: str = "auto", flags: set[str] | None = None
) -> tuple[str, str]:
    """The precision to score a `precision`-trained model in on `platform`, and why when it is
    not the run's (else ''): fp32 for a bf16 or fp16 run on a CPU without that type's
    instructions (`flags`: the CPU's, read when None); the run's own everywhere else (TPUs,
    GPUs, CPUs that have them). `choice` is `SCORE_PRECISION_ENV`'s value.

    Raises:
      ValueError: a `choice` other than auto, fp32 or run.
    """
    if choice not in ("auto", "fp32", "run"):
        raise ValueError(f"{SCORE_PRECISION_ENV}={choice}: expected auto, fp32 or run")
    if precision not in _NATIVE or choice == "run":
        return precision, ""
    if choice == "fp32":
        return "fp32", f"{SCORE_PRECISION_ENV}=fp32"
    if platform != "cpu":
        return precision, ""
    have = cpu_flags() if flags is None else flags
    if any(f in have for f in _NATIVE[precision]):
        return precision, ""
    wanted = " or ".join(_NATIVE[precision])
    return "fp32", f"this CPU has no {precision} instructions ({wanted}): XLA would emulate them"
