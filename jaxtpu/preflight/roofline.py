"""A roofline of a compiled step: each top-level operation of an optimized HLO module (XLA's
`compiled.as_text()`) costs max(its matmul FLOPs / the device's peak, the bytes it moves
through HBM / the device's HBM bandwidth), grouped by the JAX operation it came from. An
estimate built from the compiler's program, never a measurement.

Preflight's step-time estimate for the TPU generations whose compiler cost model gives none on
a host without a TPU (v4, v5e, v5p, v6e: `hardware.TpuChip.cost_model`); on v2 and v3, where
both exist, it tracks the cost model's `optimal_seconds` (docs/tpu.md has the figures, the tests
hold it to them). What an operation costs beyond its FLOPs' time is what memory traffic adds to
the step: `benchmarks.training.tpu_tuning --breakdown N` prints those rows.

What the v4/v5e/v6e compilers write and v2/v3's do not, read as the hardware does:
- memory spaces: an array whose layout says `S(1)` (VMEM, on-chip) or any other non-zero
  space moves no HBM bytes; the program stages operands there with async copies and slices.
  Free on-chip bytes make the roofline a lower bound of the step (the vector unit's work on
  them is not counted); counted at the HBM rate (`on_chip`) they make an upper one;
- async pairs (`copy-start`/`copy-done`, `slice-start`, `collective-permute-start`...): the
  bytes move once, at the start, HBM sides only; the done and bookkeeping custom calls
  (`AllocateBuffer`, `ConcatBitcast`) move nothing;
- loops (`while`, e.g. the windowed matmuls of FSDP's collective matmuls, or scanned layers):
  the body costs once per iteration, its trip count read from the loop's backend config or its
  condition (`i < N`); a loop whose count cannot be read counts once and is reported
  (`Row.unknown_trips`).

Framework-free (text in, rows out).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

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


def _arrays(shape: str) -> list[tuple[int, bool]]:
    """(bytes as stored, in HBM) of every array in a shape, a tuple's parts in order. A TPU
    layout's tile (`{1,0:T(8,128)}`) pads the most minor dimensions to its multiples; a memory
    space other than 0 (`S(1)`: VMEM) is on the chip, not in HBM."""
    arrays = []
    for m in _STORED.finditer(shape):
        dims = [int(d) for d in m.group(2).split(",") if d]
        layout = m.group(3) or ""
        tile = re.search(r"T\(([0-9,]+)\)", layout)
        if tile and dims:
            minor_first = [int(i) for i in layout.split(":")[0].split(",") if i]
            tile_minor_first = [int(t) for t in reversed(tile.group(1).split(","))]
            for axis, size in zip(minor_first, tile_minor_first, strict=False):
                dims[axis] = -(-dims[axis] // size) * size
        space = re.search(r"S\((\d+)\)", layout.split(":", 1)[-1] if ":" in layout else "")
        in_hbm = not space or space.group(1) == "0"
        arrays.append((_BYTES[m.group(1)] * math.prod(dims), in_hbm))
    return arrays


def _nbytes(shape: str, on_chip: bool = False) -> int:
    """HBM bytes of every array in a shape (a tuple's parts summed), as stored (`on_chip`: the
    arrays in on-chip memory too)."""
    return sum(size for size, in_hbm in _arrays(shape) if in_hbm or on_chip)


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
    if window and labels and "lhs_dilate" not in line:  # a dilated window is a batch dimension
        # a window sums over at most the input's extent: a size-2 window over a padded
        # size-1 dimension (how the v5e compiler writes two chunks of a windowed matmul)
        # multiplies each output by one real element
        for spatial, w in enumerate(window.group(1).split("x")):
            axis = labels.group(1).find(str(spatial))
            k *= min(int(w), lhs[axis]) if 0 <= axis < len(lhs) else int(w)
    return 2 * size * k


def _summed(comps: dict[str, list[str]], name: str, seen: dict[str, int], count: Any) -> int:
    """`count(line, out, op, args, shapes)` summed over a computation's instructions, the
    fusions it calls included (memoised in `seen` per computation and count)."""
    key = f"{count.__name__} {name}"
    if key in seen:
        return seen[key]
    shapes: dict[str, str] = {}
    total = 0
    for line in comps.get(name, []):
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, out, op, args = m.groups()
        shapes[inst] = out
        if op == "fusion":
            called = re.search(r"calls=(%[\w.\-]+)", line)
            total += _summed(comps, called.group(1), seen, count) if called else 0
        else:
            total += count(line, out, op, args, shapes)
    seen[key] = total
    return total


def _matmul_flops(line: str, out: str, op: str, args: str, shapes: dict[str, str]) -> int:
    return _contraction_flops(line, out, op, shapes) if op in ("dot", "convolution") else 0


def _flops(comps: dict[str, list[str]], name: str, seen: dict[str, int]) -> int:
    """Matmul FLOPs of a computation, fusions it calls included."""
    return _summed(comps, name, seen, _matmul_flops)


# What the TPU compiler's cost model charges a gather that picks single elements along the
# operand's minor (lane) dimension, as `take_along_axis` over the last axis does (DeBERTa's
# relative attention): per index, every (8, 128) tile of the operand its slice touches, plus
# 512 bytes. Measured on v3 with libtpu 0.0.50.1 (`bytes accessed` of take_along_axis
# programs, f32 and bf16, 128 and 256 positions, one index per element: 4,632-4,648 and 2,578
# bytes per element, within 1% of this rule). Gathers of whole rows (embeddings) it charges
# as the bytes they move, as the roofline does.
GATHER_TILE_ELEMENTS = 8 * 128
GATHER_INDEX_BYTES = 512


def _gather_bytes(comps: dict[str, list[str]], name: str, seen: dict[str, int]) -> int:
    """The bytes element-wise gathers in a computation (fusions it calls included) cost beyond
    their arrays: per index, the (8, 128) tiles its slice touches and `GATHER_INDEX_BYTES`."""
    return _summed(comps, name, seen, _element_gather)


def _element_gather(line: str, out: str, op: str, args: str, shapes: dict[str, str]) -> int:
    sizes = re.search(r"slice_sizes=\{([0-9,]*)\}", line) if op == "gather" else None
    operand = re.findall(r"%[\w.\-]+", args.split(")")[0])
    stored = _STORED.search(shapes.get(operand[0], "")) if sizes and operand else None
    if not stored:
        return 0
    dims = [int(d) for d in stored.group(2).split(",") if d]
    layout = [int(i) for i in (stored.group(3) or "").split(":")[0].split(",") if i]
    order = layout or list(reversed(range(len(dims))))  # minor first
    slice_sizes = [int(x) for x in sizes.group(1).split(",") if x]
    if len(order) < 2 or dims[order[0]] <= 1 or slice_sizes[order[0]] != 1:
        return 0  # not element-wise along the lanes
    tiles = -(-slice_sizes[order[1]] // 8) * math.prod(slice_sizes[d] for d in order[2:])
    indices = math.prod(_dims(out)) // max(math.prod(slice_sizes), 1)
    return indices * (tiles * GATHER_TILE_ELEMENTS * _BYTES[stored.group(1)] + GATHER_INDEX_BYTES)


# Custom calls that only rename or reserve memory (the TPU compiler's bookkeeping).
_FREE_CALLS = {"AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound"}


def _defined(lines: list[str]) -> dict[str, tuple[str, list[str], str]]:
    """A computation's instructions by name: (opcode, operands, line)."""
    found = {}
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m:
            args = re.sub(r"/\*[^*]*\*/", "", m.group(4)).split(")")[0]
            found[m.group(1)] = (m.group(3), re.findall(r"%[\w.\-]+", args), line)
    return found


def _constant(found: dict[str, tuple[str, list[str], str]], name: str) -> int | None:
    op, _, line = found.get(name, ("", [], ""))
    value = re.search(r"constant\((-?\d+)\)", line) if op == "constant" else None
    return int(value.group(1)) if value else None


def trip_count(comps: dict[str, list[str]], line: str) -> int | None:
    """How many times a `while` runs its body: its backend config's `known_trip_count`, or its
    condition `counter < N` with the body's `counter + step` (the windowed matmuls of FSDP step
    by 2: one chunk each way round the ring), counting from 0 as the loops XLA and JAX write
    do; None when neither says."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    if known:
        return int(known.group(1))
    cond = re.search(r"condition=(%[\w.\-]+)", line)
    body = re.search(r"body=(%[\w.\-]+)", line)
    if not cond or not body or body.group(1) not in comps:
        return None
    in_cond = _defined(comps.get(cond.group(1), []))
    compare = _root(in_cond)
    if (
        compare is None
        or compare[0] != "compare"
        or "direction=LT" not in compare[2]
        or len(compare[1]) != 2
    ):
        return None
    counter, limit = compare[1][0], _constant(in_cond, compare[1][1])
    _, _, counter_line = in_cond.get(counter, ("", [], ""))
    index = re.search(r"get-tuple-element\(.*index=(\d+)", counter_line)
    if limit is None or not index:
        return None
    in_body = _defined(comps[body.group(1)])
    step = 1
    carried = _root(in_body)  # the tuple the next iteration starts from
    if carried and carried[0] == "tuple" and int(index.group(1)) < len(carried[1]):
        op, operands, _ = in_body.get(carried[1][int(index.group(1))], ("", [], ""))
        if op == "add":
            step = next((v for v in (_constant(in_body, o) for o in operands) if v), 1)
    return max(0, -(-limit // step))


def _root(found: dict[str, tuple[str, list[str], str]]) -> tuple[str, list[str], str] | None:
    return next((v for v in found.values() if v[2].lstrip().startswith("ROOT ")), None)


def _bookkeeping(line: str, op: str) -> bool:
    """Moves no data: a tuple's parts, an async pair's done (its bytes are counted at its
    start), the compiler's renaming custom calls."""
    if op in _FREE or op.endswith("-done"):
        return True
    target = re.search(r'custom_call_target="(\w+)"', line) if op == "custom-call" else None
    return bool(target and target.group(1) in _FREE_CALLS)


def _operation(
    comps: dict[str, list[str]],
    line: str,
    out: str,
    op: str,
    args: str,
    shapes: dict[str, str],
    seen: dict[str, int],
    on_chip: bool,
) -> tuple[int, int]:
    """(matmul FLOPs, HBM bytes moved) of one instruction that is not a loop nor bookkeeping."""
    operands = re.findall(r"%[\w.\-]+", re.split(r"calls=|metadata=|to_apply=", args)[0])
    if op.endswith("-start"):
        parts = _arrays(out)  # (source(s), destination, context...)
        if len(parts) < 2:
            return 0, _nbytes(out)
        size, dst_in_hbm = parts[1]
        dst = int(dst_in_hbm or on_chip)
        if op in ("copy-start", "slice-start"):  # one DMA: read the source, write the copy
            src = any(h or on_chip for _, h in _arrays(shapes.get(operands[0], "")))
            return 0, size * (int(src) + dst)
        return 0, sum(_nbytes(shapes.get(o, ""), on_chip) for o in operands) + size * dst
    moved = _nbytes(out, on_chip) + sum(_nbytes(shapes.get(o, ""), on_chip) for o in operands)
    if op == "fusion":
        called = re.search(r"calls=(%[\w.\-]+)", line)
        if not called:
            return 0, moved
        gathers = _gather_bytes(comps, called.group(1), seen)
        return _flops(comps, called.group(1), seen), moved + gathers
    if op in ("dot", "convolution"):
        return _contraction_flops(line, out, op, shapes), moved
    return 0, moved


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
    count: int = 0  # operations run per step (a loop's body once per iteration)
    flops: float = 0.0
    bytes: float = 0.0
    seconds: float = 0.0  # sum of each operation's max(FLOP time, memory time)
    beyond_flops: float = 0.0  # what memory traffic adds on top of the FLOPs' time
    unknown_trips: int = 0  # loops whose trip count could not be read (counted once)


def roofline(text: str, peak_flops: float, bandwidth: float, on_chip: bool = False) -> list[Row]:
    """One row per group of the operations the entry computation runs (`_group`; a loop's
    body's operations once per iteration), the longest time beyond FLOPs first.

    `on_chip`: the bytes of arrays in on-chip memory (VMEM) are counted at the HBM bandwidth
    too, as if the program had kept them in HBM: the compiler's own `bytes accessed` counts
    them so. Without it they are free, which ignores the vector unit's work on them; the two
    bracket the step on a generation whose program stages operands on the chip (v4 and
    later), and agree on one that does not (v2, v3)."""
    comps, entry = _computations(text)
    seen: dict[str, int] = {}
    header = next(line for line in text.splitlines() if line.startswith("ENTRY"))
    shapes = {
        "%" + m.group(1): m.group(2)
        for m in re.finditer(r"(\w[\w.\-]*): ((?:" + "|".join(_BYTES) + r")\[[0-9,]*\])", header)
    }
    rows: dict[str, Row] = {}

    def walk(name: str, shapes: dict[str, str], times: int) -> None:
        for line in comps[name]:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            inst, out, op, args = m.groups()
            shapes[inst] = out
            if op in ("while", "call"):
                body = re.search(r"(?:body|to_apply)=(%[\w.\-]+)", line)
                trips = trip_count(comps, line) if op == "while" else 1
                if body and body.group(1) in comps:
                    if trips is None:
                        rows.setdefault(_group(line, inst, op), Row(_group(line, inst, op)))
                        rows[_group(line, inst, op)].unknown_trips += 1
                    walk(body.group(1), {}, times * (trips or 1))
                    continue
            if _bookkeeping(line, op):
                continue
            flops, moved = _operation(comps, line, out, op, args, shapes, seen, on_chip)
            group = _group(line, inst, op)
            row = rows.setdefault(group, Row(group))
            row.count += times
            row.flops += flops * times
            row.bytes += moved * times
            row.seconds += max(flops / peak_flops, moved / bandwidth) * times
            row.beyond_flops += max(0.0, moved / bandwidth - flops / peak_flops) * times

    walk(entry, shapes, 1)
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
        whole.unknown_trips += r.unknown_trips
    return whole


_MATMULS = frozenset({"convolution", "dot"})
_PERMUTES = frozenset({"collective-permute", "collective-permute-start"})


def program_counts(text: str) -> dict[str, int]:
    """What the compiler wrote into the program, each instruction once as written (a loop's
    body once): operations whose result is in on-chip memory (a layout with `S(1)`, VMEM;
    bookkeeping such as parameters and tuples, which name arrays made elsewhere, aside), async
    copies and slices that stage operands there, loops, and windowed matmul loops (a loop whose
    body, its fusions included, has both a matmul and a collective-permute: a collective matmul,
    e.g. FSDP's reduce-scatter fused into a weight gradient's matmul)."""
    comps, _ = _computations(text)
    parsed = {  # each computation's (line, result shape, op), parsed once
        name: [(line, m.group(2), m.group(3)) for line in lines if (m := _INSTRUCTION.match(line))]
        for name, lines in comps.items()
    }

    def called(name: str, seen: set[str]) -> set[str]:
        """The ops of `name` and of the computations it calls (fusions, calls; not the bodies
        of loops inside it, which count as loops of their own)."""
        seen.add(name)
        found = {op for _, _, op in parsed[name]}
        for line, _, _ in parsed[name]:
            for callee in re.findall(r"(?:calls|to_apply)=(%[\w.\-]+)", line):
                if callee in comps and callee not in seen:
                    found |= called(callee, seen)
        return found

    counts = dict.fromkeys(("on_chip", "copy_starts", "slice_starts", "loops", "windowed"), 0)
    for instructions in parsed.values():
        for line, out, op in instructions:
            counts["on_chip"] += "S(1)" in out and op not in _FREE
            counts["copy_starts"] += op == "copy-start"
            counts["slice_starts"] += op == "slice-start"
            if op == "while":
                counts["loops"] += 1
                body = re.search(r"body=(%[\w.\-]+)", line)
                inside = called(body.group(1), set()) if body and body.group(1) in comps else set()
                counts["windowed"] += bool(inside & _MATMULS and inside & _PERMUTES)
    return counts


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
