"""The device layout a run's flags ask for: `--sharding auto` resolved for the strategy, and
the data x fsdp mesh sizes of `--mesh`, with the combinations a strategy cannot run refused
(framework-free: flags in, sizes out; `jaxtpu.engine.placement` places arrays on that mesh).
"""

from __future__ import annotations

from jaxtpu.core.errors import ConfigError

MESH_AXES = ("data", "fsdp")
# Data-parallel strategies of each side; the first is that side's default.
JAX_STRATEGIES = ("jit", "pmap", "shard_map")
TORCH_STRATEGIES = ("spmd", "spawn", "eager", "ddp")


def parse_mesh(mesh: str) -> dict[str, int]:
    """`'data=2,fsdp=4'` -> {'data': 2, 'fsdp': 4} (a missing axis has size 1)."""
    sizes = dict.fromkeys(MESH_AXES, 1)
    seen = set()
    for part in mesh.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name not in MESH_AXES or name in seen or not value.strip().isdigit():
            raise ConfigError(
                f"--mesh {mesh}: expected data=D,fsdp=F with positive integers (axes "
                f"{', '.join(MESH_AXES)}, each at most once)"
            )
        seen.add(name)
        sizes[name] = int(value)
        if sizes[name] < 1:
            raise ConfigError(f"--mesh {mesh}: axis {name} must be >= 1")
    return sizes


def resolve_sharding(parallel: str, sharding: str, platform: str = "", mesh: str = "") -> str:
    """--sharding with 'auto' resolved for the strategy and the devices' `platform`:
    replicated under pmap (which replicates the whole state); under jit without --mesh, FSDP
    on a TPU (the TPU compiler's cost model estimates BERT-base's step shorter than with
    ZeRO-1, docs/tpu.md "Tuned for the TPU") and ZeRO-1 elsewhere (measured on this CPU);
    ZeRO-1 on any other jit or shard_map mesh."""
    if sharding != "auto":
        return sharding
    if parallel == "pmap":
        return "replicated"
    return "fsdp" if parallel == "jit" and platform == "tpu" and not mesh else "zero1"


def resolve_matmul_output(flag: str, platform: str = "", precision: str = "bf16") -> str:
    """--matmul-output with 'auto' resolved for the devices' `platform`: the dtype of the bf16
    matmuls' results, forward and backward. bf16 on a TPU (the TPU compiler's cost model
    estimates BERT-base's step shorter, docs/tpu.md "Tuned for the TPU"; also what
    torch.autocast returns), fp32 elsewhere (the choice measured on this CPU,
    docs/benchmarks.md) and for every --precision fp16 run (fp16 results would overflow
    where bf16's do not)."""
    if flag != "auto":
        return flag
    return "bf16" if platform == "tpu" and precision == "bf16" else "fp32"


def mesh_sizes(
    parallel: str, sharding: str, mesh: str, devices: int, platform: str = ""
) -> tuple[int, int]:
    """(data, fsdp) sizes of the mesh over `devices` (all processes'), after checking that the
    strategy can use that mesh and sharding. The torch side's strategies have no mesh flags
    (it refuses them itself): all devices on data."""
    sharding = resolve_sharding(parallel, sharding, platform, mesh)
    if parallel not in JAX_STRATEGIES:
        return devices, 1
    if parallel == "pmap" and (sharding != "replicated" or mesh):
        flag = f"--sharding {sharding}" if sharding != "replicated" else f"--mesh {mesh}"
        raise ConfigError(f"{flag} needs --parallel jit (pmap replicates the whole state)")
    if parallel == "shard_map" and sharding == "fsdp":
        raise ConfigError(
            "--sharding fsdp needs --parallel jit (shard_map's per-device step sees the whole "
            "state)"
        )
    if not mesh:
        return (1, devices) if sharding == "fsdp" else (devices, 1)
    sizes = parse_mesh(mesh)
    if sizes["data"] * sizes["fsdp"] != devices:
        raise ConfigError(
            f"--mesh {mesh}: data x fsdp = {sizes['data'] * sizes['fsdp']}, but the run "
            f"has {devices} devices (--num-devices x --num-processes)"
        )
    if parallel == "shard_map" and sizes["fsdp"] > 1:
        raise ConfigError(
            f"--mesh {mesh}: shard_map runs on the data axis only; use "
            "--parallel jit for an fsdp axis"
        )
    return sizes["data"], sizes["fsdp"]
