"""Where a compiled step's estimated time goes: a roofline of each top-level operation of an
optimized HLO module (XLA's `compiled.as_text()`), grouped by the JAX operation it came from.

Each operation (a fusion, a copy, a collective) costs max(its matmul FLOPs / the device's
peak, the bytes it reads and writes, as its layout's tiles store them / the device's memory
bandwidth). Summed over the module this tracks the TPU compiler's own cost model (how closely,
for BERT-base on v3-8 and for the test models, is in docs/tpu.md; the test holds it to its
tolerances). What an operation costs beyond its FLOPs' time is what memory traffic adds to
the step: the rows to work on when a step is far from its FLOP floor. An estimate built from
the compiler's program, not a measurement.

Framework-free (text in, rows out): `benchmarks.tpu_tuning --breakdown N` feeds it the TPU
program.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_STORED = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\](?:\{([^}]*)\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*)$")
_HEADER = re.compile(r"^(ENTRY )?(%[\w.\-]+) ")
# Bookkeeping that moves no data (a tuple's parts are counted where they are made and used).
_FREE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
}


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _nbytes(shape: str) -> int:
    """Bytes of every array in a shape (a tuple's parts summed), as stored: a TPU layout's
    tile (`{1,0:T(8,128)}`) pads the most minor dimensions to its multiples."""
    total = 0
    for m in _STORED.finditer(shape):
        dims = [int(d) for d in m.group(2).split(",") if d]
        layout = m.group(3) or ""
        tile = re.search(r"T\(([0-9,]+)\)", layout)
        if tile and dims:
            minor_first = [int(i) for i in layout.split(":")[0].split(",") if i]
            tile_minor_first = [int(t) for t in reversed(tile.group(1).split(","))]
            for axis, size in zip(minor_first, tile_minor_first, strict=False):
                dims[axis] = -(-dims[axis] // size) * size
        total += _BYTES[m.group(1)] * math.prod(dims)
    return total


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """The module's computations (name -> instruction lines) and the entry's name."""
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and line.rstrip().endswith("{"):
            current = header.group(2)
            comps[current] = []
            entry = current if header.group(1) else entry
        elif current is not None and line.startswith("  "):
            comps[current].append(line)
    if not entry:
        raise ValueError("no ENTRY computation in this HLO text")
    return comps, entry


def _contraction_flops(line: str, out: str, op: str, shapes: dict[str, str]) -> int:
    """2 x output elements x contracted size of one dot or convolution (TPU programs write
    matmuls as convolutions, batch dimensions as dilated windows)."""
    operands = re.findall(r"%[\w.\-]+", line.split(" " + op + "(", 1)[1].split(")")[0])
    lhs = _dims(shapes.get(operands[0], "")) if operands else []
    size = math.prod(_dims(out))
    if op == "dot":
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", line)
        k = math.prod(lhs[int(i)] for i in m.group(1).split(",") if i) if m and lhs else 1
        return 2 * size * k
    labels = re.search(r"dim_labels=(\w+)_", line)
    k = lhs[labels.group(1).index("f")] if labels and lhs and "f" in labels.group(1) else 1
    groups = re.search(r"feature_group_count=(\d+)", line)
    k //= int(groups.group(1)) if groups else 1
    window = re.search(r"window=\{size=([0-9x]+)", line)
    if window and "lhs_dilate" not in line:  # a dilated window is a batch dimension
        k *= math.prod(int(w) for w in window.group(1).split("x"))
    return 2 * size * k


def _flops(comps: dict[str, list[str]], name: str, seen: dict[str, int]) -> int:
    """Matmul FLOPs of a computation, fusions it calls included."""
    if name in seen:
        return seen[name]
    shapes: dict[str, str] = {}
    total = 0
    for line in comps.get(name, []):
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, out, op, _ = m.groups()
        shapes[inst] = out
        if op in ("dot", "convolution"):
            total += _contraction_flops(line, out, op, shapes)
        elif op == "fusion":
            called = re.search(r"calls=(%[\w.\-]+)", line)
            total += _flops(comps, called.group(1), seen) if called else 0
    seen[name] = total
    return total


def _group(line: str, inst: str, op: str) -> str:
    """The JAX operation an instruction came from, layers folded together: "forward" or
    "backward" and the op_name's path, e.g. `backward layer_N/attention/self/bhqd,...`."""
    m = re.search(r'op_name="([^"]*)"', line)
    name = m.group(1) if m else inst
    kind = re.search(r"kind=k(\w+)", line)
    op = f"{op}/{kind.group(1).lower()}" if kind else op
    direction = "backward " if "transpose(jvp(" in name else "forward " if "jvp(" in name else ""
    path = re.sub(r"^(jit\([^)]*\)/)+", "", name)  # the jit wrappers
    path = re.sub(r"^(transpose\()?jvp\([^)]*\)\)?/", "", path)  # the autodiff transform
    path = re.sub(r"^\w+/encoder/", "", re.sub(r"layer_\d+", "layer_N", path))
    return f"{op:16s} {direction}{path}"


@dataclass
class Row:
    group: str
    count: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    seconds: float = 0.0  # sum of each operation's max(FLOP time, memory time)
    beyond_flops: float = 0.0  # what memory traffic adds on top of the FLOPs' time


def roofline(text: str, peak_flops: float, bandwidth: float) -> list[Row]:
    """One row per group of the entry computation's operations (`_group`), the longest time
    beyond FLOPs first."""
    comps, entry = _computations(text)
    seen: dict[str, int] = {}
    header = next(line for line in text.splitlines() if line.startswith("ENTRY"))
    shapes = {
        "%" + m.group(1): m.group(2)
        for m in re.finditer(r"(\w[\w.\-]*): ((?:" + "|".join(_BYTES) + r")\[[0-9,]*\])", header)
    }
    rows: dict[str, Row] = {}
    for line in comps[entry]:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, out, op, args = m.groups()
        shapes[inst] = out
        if op in _FREE:
            continue
        operands = re.findall(r"%[\w.\-]+", re.split(r"calls=|metadata=|to_apply=", args)[0])
        moved = _nbytes(out) + sum(_nbytes(shapes.get(o, "")) for o in operands)
        if op == "fusion":
            called = re.search(r"calls=(%[\w.\-]+)", line)
            flops = _flops(comps, called.group(1), seen) if called else 0
        elif op in ("dot", "convolution"):
            flops = _contraction_flops(line, out, op, shapes)
        else:
            flops = 0
        group = _group(line, inst, op)
        row = rows.setdefault(group, Row(group))
        row.count += 1
        row.flops += flops
        row.bytes += moved
        row.seconds += max(flops / peak_flops, moved / bandwidth)
        row.beyond_flops += max(0.0, moved / bandwidth - flops / peak_flops)
    return sorted(rows.values(), key=lambda r: -r.beyond_flops)


def total(rows: list[Row]) -> Row:
    """The module's totals: its `seconds` is the roofline's estimate of the whole step."""
    whole = Row("all operations")
    for r in rows:
        whole.count += r.count
        whole.flops += r.flops
        whole.bytes += r.bytes
        whole.seconds += r.seconds
        whole.beyond_flops += r.beyond_flops
    return whole


def table(rows: list[Row], top: int, compiler_seconds: float = 0.0) -> str:
    """The `top` rows as text, with the module's totals (and the compiler's estimate)."""
    lines = [f"{'ms':>8} {'beyond':>8} {'GB':>7} {'n':>4}  operation (forward/backward, path)"]
    for r in [*rows[:top], total(rows)]:
        lines.append(
            f"{r.seconds * 1e3:8.3f} {r.beyond_flops * 1e3:8.3f} "
            f"{r.bytes / 1e9:7.3f} {r.count:4d}  {r.group}"
        )
    if compiler_seconds:
        lines.append(f"the compiler's own estimate of the step: {compiler_seconds * 1e3:.3f} ms")
    return "\n".join(lines)
