"""`jaxtpu preflight --target t4x2|p100|t4|l4|a100-40|a100-80|h100`: GPU targets are estimated
without a GPU (memory from XLA:CPU's compilation of the same sharded program, the step as the
FLOP floor at the GPU's peak, the program lowered for CUDA), labelled so; and their flags are
checked in one line before anything compiles."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_exit_2

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.hardware import BF16_MIN_COMPUTE_CAPABILITY, GPU_CHIPS, GiB
from jaxtpu.preflight import command as pf_command
from jaxtpu.preflight import report as pf_report
from jaxtpu.preflight import speed as pf_speed
from jaxtpu.preflight import targets as pf_targets


def test_the_gpu_targets_are_the_issues_and_bf16_follows_the_compute_capability():
    assert list(pf_targets.GPU_TARGETS) == [
        "t4x2",
        "p100",
        "t4",
        "l4",
        "a100-40",
        "a100-80",
        "h100",
    ]
    assert pf_targets.GPU_TARGETS["t4x2"].count == 2
    assert set(pf_targets.TARGETS) >= set(pf_targets.GPU_TARGETS)
    for name, chip in GPU_CHIPS.items():
        cc = tuple(int(x) for x in chip.compute_capability.split("."))
        # the chip table and the precision check agree on which GPUs have bfloat16
        assert (chip.bf16_tflops > 0) == (cc >= BF16_MIN_COMPUTE_CAPABILITY), name
        assert chip.fp16_tflops >= chip.fp32_tflops > 0, name
    table = pf_targets.gpu_targets_table()
    assert table.count("\n") == len(pf_targets.GPU_TARGETS) + 1
    assert "| `t4x2` | Tesla T4 | 2 (Kaggle's T4 x2) | 16 GiB | 8.1 / 65 / none TFLOP/s |" in table


def test_the_memory_a_gpu_gives_is_jaxs_share_of_it(monkeypatch):
    t4 = pf_targets.GPU_TARGETS["t4"]
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    assert t4.memory_per_device() == 12 * GiB  # 75% of 16 GiB
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    assert t4.memory_per_device() == 8 * GiB
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.25")  # the new name wins
    assert t4.memory_per_device() == 4 * GiB
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "1.5")
    with pytest.raises(ConfigError, match="XLA_CLIENT_MEM_FRACTION=1.5: not a fraction"):
        t4.memory_per_device()


@pytest.mark.parametrize(("precision", "peak"), [("fp16", 65e12), ("fp32", 8.1e12)])
def test_a_gpu_step_is_estimated_as_its_flop_floor_at_the_precisions_peak(precision, peak):
    from jaxtpu.core.flags.presets import tiny

    report = pf_report.Report("t4", "zero1", "none", "data=1,fsdp=1", 8, 128)
    report.flops_per_step = 3.25e12
    pf_speed._add_floor(report, tiny().replace(precision=precision), pf_targets.GPU_TARGETS["t4"])
    assert report.est_step_s == pytest.approx(3.25e12 / peak)
    assert report.est_method == pf_report.FLOOR and not report.peak_flops  # no MFU bound from it
    note = pf_report.estimate_note([report])
    assert "flop floor: the FLOP floor on a GPU target" in note and "lower bound" in note


@pytest.mark.parametrize(
    ("flags", "precision", "devices", "said"),
    [
        (["--target", "t4x2"], "fp16", 2, "--target t4x2: using --num-devices 2 --precision fp16"),
        (["--target", "p100", "--num-devices", "1"], "fp16", 1, "using --precision fp16 (give"),
        (["--target", "l4"], "bf16", 1, "--target l4: using --num-devices 1 (give"),
        (["--target", "v5e-1"], "bf16", 1, "--target v5e-1: using --num-devices 1"),
        (["--target", "t4x2", "--precision", "bf16", "--num-devices", "1"], "bf16", 1, ""),
    ],
)
def test_a_target_implies_its_device_count_and_a_precision_it_has(
    flags, precision, devices, said, capsys
):
    """Issue 86, item 16 (before: --target t4x2 refused bf16, then 8 devices, one at a time):
    what the user did not give is chosen and said in one line; what they gave is kept, for
    the target's checks to refuse (the last case, in the test below)."""
    from jaxtpu.core.flags.cli import parse_with

    cfg, args = parse_with(
        ["--preset", "tiny", *flags], "preflight", "", ("jit", "shard_map"), pf_command._add_flags
    )
    cfg = pf_targets.implied_by_target(cfg, args)
    assert (cfg.train.precision, cfg.placement.num_devices) == (precision, devices)
    err = capsys.readouterr().err
    assert (said in err) if said else err == ""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target", "t4", "--precision", "bf16", "--num-devices", "1"], "has no bfloat16"),
        (["--target", "p100", "--precision", "bf16", "--num-devices", "1"], "use --precision fp16"),
        (["--target", "t4x2", "--precision", "fp16", "--num-devices", "1"], "use --num-devices 2"),
        (
            ["--target", "l4", "--num-devices", "1", "--save-programs", "somewhere"],
            "estimated, not compiled for",
        ),
    ],
)
def test_bad_gpu_target_flags_are_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "p.json"
    err = one_line_exit_2(
        capsys, lambda: pf_command.main(["--preset", "tiny", "--json", str(out), *flags])
    )
    assert message in err and not out.exists()


@pytest.mark.model
def test_kaggles_t4x2_is_estimated_and_labelled_so(tmp_path, capsys, monkeypatch):
    """One compilation on 2 host devices and one CUDA lowering of the tiny model in fp16."""
    from jaxtpu.preflight import fit as pf_fit

    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    platforms = []
    lower = pf_fit.lower

    def recording(cfg, devices, spec=None, platform=""):
        platforms.append(platform)
        low = lower(cfg, devices, spec, platform)
        if platform:
            # the CUDA program is a program of its own, not the CPU's relabelled
            assert low.train.as_text() != lower(cfg, devices, spec).train.as_text()
        return low

    monkeypatch.setattr(pf_fit, "lower", recording)
    out = tmp_path / "t4x2.json"
    argv = ["--preset", "tiny", "--target", "t4x2", "--num-devices", "2", "--precision", "fp16"]
    assert pf_command.main([*argv, "--json", str(out)]) == 0
    assert platforms == ["", "cuda"]
    (saved,) = json.loads(out.read_text())["reports"]
    assert saved["device"] == "Tesla T4" and saved["capacity"] == 12 * GiB
    assert saved["sharding"] == "zero1"  # jit's GPU default: the TPU's FSDP default is the TPU's
    assert saved["fits"] and saved["est_method"] == pf_report.FLOOR
    assert saved["est_step_s"] == pytest.approx(saved["flops_per_step"] / 65e12)
    printed = capsys.readouterr()
    assert "2 x Tesla T4, 12.00 GiB each: 75% of 16 GiB; estimated on 2 host CPU" in printed.err
    assert "estimated as the FLOP floor at the GPU's peak (a lower bound) (not measured)" in (
        printed.err
    )
    assert "an epoch (" in printed.err and "at least" in printed.err
    assert "memory per device estimated: XLA:CPU's buffer assignment" in printed.out
    assert "| flop floor |" in printed.out


@pytest.mark.model
def test_a_program_that_does_not_lower_for_cuda_is_refused(monkeypatch):
    from jaxtpu.core.flags.presets import tiny
    from jaxtpu.preflight import fit as pf_fit

    lower = pf_fit.lower

    def no_cuda(cfg, devices, spec=None, platform=""):
        if platform == "cuda":
            raise NotImplementedError(
                "MLIR translation rule for primitive 'x' not found for platform cuda"
            )
        return lower(cfg, devices, spec, platform)

    monkeypatch.setattr(pf_fit, "lower", no_cuda)
    devices, capacity = pf_targets.target_devices("t4", 1)
    report = pf_fit.check(
        tiny().replace(precision="fp16", num_devices=1), "t4", devices, capacity, speed=False
    )
    assert not report.fits and report.error.startswith("does not lower for CUDA: MLIR translation")


def test_the_decoder_tables_t4x2_row_is_fp16_and_reads_its_floor(tmp_path):
    from benchmarks.training import decoders

    assert ("Qwen3-4B", "t4x2") in decoders.ROWS
    cfg = decoders.run_config(tmp_path, "Qwen3-4B", 512, 4, "t4x2")
    assert cfg.train.precision == "fp16" and cfg.placement.num_devices == 2
    r = pf_report.Report("t4x2", "zero1", "layer", "data=2,fsdp=1", 5, 512, capacity=12 * GiB)
    r.extra["largest_batch"], r.est_step_s, r.est_method = 5, 0.5, pf_report.FLOOR
    cells = [c.strip() for c in decoders.row({"model": "Qwen3-4B", **r.__dict__}).split("|")]
    # a floor has no upper end: 5 x 2 comments in 0.5 s, and the rules epoch at that rate
    assert cells[9:12] == ["0.500", "20", f"{-(-decoders.RULES_TRAIN // 10) * 0.5 / 60:.1f}"]
