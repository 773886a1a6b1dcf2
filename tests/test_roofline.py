"""`jaxtpu.preflight.roofline`: a compiled program's step time from its operations (preflight's
estimate on v4, v5e, v5p and v6e). The v5e-style module (tests/tpu_v5e_style.hlo) is written
with the TPU compiler's own syntax (memory spaces, async copies and slices, bookkeeping
custom calls, a windowed matmul's loop that steps by 2, a window over a padded dimension);
every expected figure is worked out by hand from its shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxtpu.preflight import roofline

# In HBM, bf16[8,128] is 2,048 bytes, bf16[128,256] 65,536, f32[8,256] 8,192, a u32 scalar 4
# (tiles pad only the dimensions they name).
V5E_STYLE = (Path(__file__).parent / "tpu_v5e_style.hlo").read_text()
GATHERS = (Path(__file__).parent / "tpu_gathers.hlo").read_text()

MATMUL = 2 * 8 * 256 * 128  # the 8 x 128 @ 128 x 256 of %fused_mul
BODY_BYTES = (8192 + 2048 + 65536) + (4 + 4 + 4)  # its fusion, then the counter's add


def test_loops_run_their_body_once_per_iteration():
    comps, _ = roofline._computations(V5E_STYLE)
    entry = {line.split(" = ")[0].strip(): line for line in comps["%main"]}
    assert roofline.trip_count(comps, entry["%while"]) == 2  # 0, 2: i < 4 stepping by 2
    assert roofline.trip_count(comps, entry["%known"]) == 3  # the backend config says
    assert roofline.trip_count(comps, entry["%unread"]) is None  # `d != 5`: not read


def test_a_v5e_style_program_counts_hbm_bytes_once_and_loops_per_iteration():
    peak, bandwidth = 1e12, 1e10
    rows = roofline.roofline(V5E_STYLE, peak, bandwidth)
    whole = roofline.total(rows)
    # %fusion, the loops' bodies 2 + 3 + 1 (the unread loop once), the windowed matmul: a
    # size-2 window over a dimension padded from 1 sums one real element (K = 16 x 1 x 4)
    window = 2 * (8 * 2 * 32) * (16 * 1 * 4)
    assert whole.flops == MATMUL * (1 + 2 + 3 + 1) + window
    expected_bytes = (
        2048  # copy-start: the HBM source read once; its VMEM copy and copy-done move none
        + 8192
        + 65536  # %fusion: its output and the weight; the VMEM operand is on the chip
        + 64 * 256 * 2  # slice-start: the slice read from HBM into VMEM, once
        + (8 * 2 * 32 * 4 + 4 * 16 * 8 * 2 + 4 * 16 * 32 * 2)  # %window, untiled
        + BODY_BYTES * (2 + 3 + 1)
        + 2 * 8192  # the ROOT copy
    )
    assert whole.bytes == expected_bytes
    assert whole.unknown_trips == 1
    loop = next(r for r in rows if r.group.endswith("backward windowed/dot_general"))
    assert loop.count == 6 and loop.flops == 6 * MATMUL
    assert loop.seconds == pytest.approx(6 * max(MATMUL / peak, 75776 / bandwidth))
    # bookkeeping (AllocateBuffer, the dones, tuples, parameters) makes no row
    ops = {r.group.split()[0] for r in rows}
    assert not ops & {"custom-call", "copy-done", "slice-done", "tuple", "parameter"}
    assert whole.seconds == pytest.approx(sum(r.seconds for r in rows))


def test_program_counts_are_what_the_compiler_wrote_and_find_a_windowed_matmul_loop():
    """Each operation once as written: four on-chip results (the copy's and the slice's start
    and done; the fused computation's parameter names the copy's array), one async copy, one
    slice, three loops; a loop is a windowed matmul one only when its body (fusions included)
    has a collective-permute beside its matmul."""
    counts = roofline.program_counts(V5E_STYLE)
    assert counts == {"on_chip": 4, "copy_starts": 1, "slice_starts": 1, "loops": 3, "windowed": 0}
    permute = "  %cp = bf16[8,128]{1,0} collective-permute(%x), source_target_pairs={{0,1},{1,0}}\n"
    windowed = V5E_STYLE.replace("  ROOT %t = ", permute + "  ROOT %t = ", 1)
    assert roofline.program_counts(windowed)["windowed"] == 3  # the three loops share %body
    # a loop around a windowed one (scanned layers) is a loop, not one more windowed loop
    state = "(u32[]{:T(128)}, bf16[8,128]{1,0:T(8,128)(2,1)}, bf16[128,256]{1,0:T(8,128)(2,1)})"
    outer = (
        f"%outer (p: {state}) -> {state} {{\n  %p = {state} parameter(0)\n"
        f"  ROOT %inner = {state} while(%p), condition=%cond, body=%body\n}}\n\nENTRY %main"
    )
    nested = windowed.replace("ENTRY %main", outer, 1).replace(
        "  ROOT %out = ",
        f"  %nest = {state} while(%tuple), condition=%cond, body=%outer\n  ROOT %out = ",
    )
    counts = roofline.program_counts(nested)
    assert (counts["loops"], counts["windowed"]) == (5, 4)


def test_roofline_counts_a_programs_bytes_and_matmul_flops():
    """The roofline of an XLA:CPU program (no tiled layouts): its bytes are XLA's
    own `bytes accessed`, its FLOPs the matmul's 2 x M x N x K, and the rows sort by the time
    memory traffic adds beyond the FLOPs."""
    import jax
    import jax.numpy as jnp

    a, b = jnp.ones((64, 32)), jnp.ones((32, 48))
    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b) * 3.0).lower(a, b).compile()
    rows = roofline.roofline(compiled.as_text(), peak_flops=1e12, bandwidth=1e11)
    assert sum(r.bytes for r in rows) == compiled.cost_analysis()["bytes accessed"]
    assert sum(r.flops for r in rows) == 2 * 64 * 48 * 32
    beyond = [r.beyond_flops for r in rows]
    assert beyond == sorted(beyond, reverse=True) and beyond[0] > 0
    assert "all operations" in roofline.table(rows, 1, 1e-3).splitlines()[-2]


def test_roofline_reads_tpu_matmuls_and_tiles():
    """A TPU program writes matmuls as convolutions (batch dimensions as dilated windows) and
    pads arrays to its layout's tile; the lines are the TPU compiler's, for BERT's attention
    scores (32 x 12 heads, 128 x 128, head dim 64) and a dense layer (768 -> 3072), in
    tests/tpu_matmuls.hlo."""

    text = (Path(__file__).parent / "tpu_matmuls.hlo").read_text()
    rows = {r.group.split()[-1]: r for r in roofline.roofline(text, 61.5e12, 450e9)}
    scores = rows["layer_N/attention/self/bhqd,bhkd->bhqk/dot_general"]
    assert scores.flops == 2 * (32 * 12 * 128 * 128) * 64  # the windows are batch, not sums
    # the head dimension, 64, is stored padded to 128 lanes: q twice and the f32 scores
    assert scores.bytes == 2 * (32 * 12 * 128 * 128 * 2) + 32 * 12 * 128 * 128 * 4
    dense = rows["layer_N/intermediate/dense/...k,kn->...n/dot_general"]
    assert dense.flops == 2 * (32 * 128 * 3072) * 768
    assert dense.seconds == dense.flops / 61.5e12  # compute-bound: nothing beyond its FLOPs
    assert rows["%copy.3"].bytes == 2 * 256 * 4  # 5 floats stored as a 256-element tile


@pytest.mark.compile
def test_the_v5e_program_is_read_whole_and_the_v3_one_tracks_the_compiler():
    """One BERT-base-wide layer (32 comments of 128 tokens per device, vocabulary 1,024)
    compiled for a v3-8 and a v5e-8 with the TPU defaults (FSDP): the v5e program's windowed
    matmul loops and on-chip staging are read so that its matmul FLOPs are the v3 program's
    to the FLOP; on v3, which stages nothing on the chip, the roofline's bytes and time stay
    within 15% of the compiler's own `bytes accessed` and `optimal_seconds` (1.005x and 0.98x
    for the whole BERT-base: benchmarks.training.estimates)."""
    from jaxtpu.core.flags import presets
    from jaxtpu.preflight import speed as pf_speed
    from jaxtpu.preflight import targets as pf_targets

    cfg = presets.tiny().replace(
        precision="bf16",
        parallel="jit",
        vocab_size=1024,
        hidden_size=768,
        intermediate_size=3072,
        num_heads=12,
        num_layers=1,
        batch_size=32,
        max_len=128,
    )
    found = {}
    for name in ("v3-8", "v5e-8"):
        devices, _ = pf_targets.target_devices(name, 8)
        compiled = pf_speed.compile_unrolled(cfg, devices)
        loops = compiled.text.count(" while(")
        found[name] = (
            pf_speed.estimate(cfg, devices, pf_targets.TPU_TARGETS[name], compiled),
            loops,
        )
    (v3, v3_loops), (v5e, v5e_loops) = found["v3-8"], found["v5e-8"]
    assert v5e_loops > 0 and v3_loops == 0  # FSDP's collective matmuls, on v5e only
    assert v5e.roofline_flops == v3.roofline_flops > 0 and v5e.unknown_trips == 0
    assert v5e.roofline_s < v5e.roofline_high_s  # the bracket: on-chip bytes free, or not
    assert v3.roofline_high_s == pytest.approx(v3.roofline_s, rel=0.01)  # scalars only
    assert v3.roofline_bytes == pytest.approx(v3.compiler_bytes, rel=0.15)
    assert v3.roofline_s == pytest.approx(v3.compiler_s, rel=0.15)


def test_element_wise_gathers_cost_the_tiles_they_touch_row_gathers_their_bytes():
    """tests/tpu_gathers.hlo: DeBERTa's relative-position gather as the TPU compiler writes it
    (one index per query and key position, each picking one element for every batch row and
    head; the operand laid out minor-first 3, 0, 2, 1) costs per index the (8, 128) tiles its
    32 x 12 slice touches (12 heads x 32 rows / 8 = 48 tiles of 4 KiB) and 512 bytes, beyond
    its arrays; an embedding lookup of whole rows costs only its arrays."""
    rows = {r.group.split()[-1]: r for r in roofline.roofline(GATHERS, 1e12, 1e10)}
    tile = 8 * 128 * 4  # an f32 (8, 128) tile
    arrays = 32 * 12 * 128 * 512 * 4 + 128 * 128 * 128 * 4 + 32 * 12 * 128 * 128 * 4
    per_index = 48 * tile + 512
    assert rows["attention/take_along_axis/gather"].bytes == arrays + 128 * 128 * per_index
    # rows of 96 floats stored 128 wide; the indices (4096, 1) stored (4096, 128)
    embedding = 1024 * 128 * 4 + 4096 * 128 * 4 + 4096 * 128 * 4
    assert rows["embeddings/take/gather"].bytes == embedding
