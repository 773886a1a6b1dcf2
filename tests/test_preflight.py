"""`jaxtpu.preflight`: the train and eval steps compile for a TPU slice on this CPU-only
machine (every code path), the memory figures move the way the options say, and bad input is
one line with nothing written."""

from __future__ import annotations

import json

import pytest
from helpers import (
    one_line_exit_2,
)

from jaxtpu.core.errors import ConfigError, DeviceError
from jaxtpu.core.flags import presets
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.hardware import TpuChip
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.preflight import command as pf_command
from jaxtpu.preflight import fit as pf_fit
from jaxtpu.preflight import report as pf_report
from jaxtpu.preflight import speed as pf_speed
from jaxtpu.preflight import targets as pf_targets

pytest.importorskip(
    "libtpu", reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)

# Activations large enough to dominate the tiny model's state.
SHAPE = dict(max_len=64, batch_size=16, parallel="jit")


@pytest.fixture(scope="module")
def v3():
    return pf_targets.target_devices("v3-8", 8)


@pytest.mark.compile
def test_tpu_readiness_every_code_path_compiles_for_a_tpu_v3_slice(tmp_path, v3, capsys):
    """Each memory option, remat policy, scanned and unrolled layers, both tasks, bf16 and
    fp32, jit and shard_map, one and several steps per call: five TPU compilations."""
    devices, capacity = v3
    assert len(devices) == 8 and capacity == 16 * 2**30  # v3: 32 GiB per chip, 2 cores
    # 1: through the command line, the default placement written as JSON: on a TPU, auto is
    # FSDP over every device (the cost model's choice, docs/tpu.md)
    out = tmp_path / "v3.json"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SHAPE.items()]
    assert (
        pf_command.main(["--preset", "tiny", "--target", "v3-8", "--json", str(out), *flags]) == 0
    )
    (auto,) = json.loads(out.read_text())["reports"]
    printed = capsys.readouterr()
    assert "| fsdp | none | no | data=1,fsdp=8 | 16 |" in printed.out
    assert "by compiler: the TPU compiler's cost model" in printed.out
    assert "estimates, not measurements" in printed.out
    assert "estimated by the TPU compiler's cost model (not measured)" in printed.err
    assert "an epoch (" in printed.err  # of the demo data the flags ask for
    tiny = presets.tiny().replace(**SHAPE)
    # Rematerialisation saves activation memory, which outweighs the rest of a 64-wide
    # model's temporaries only at longer sequences (at 64 tokens it saved 11 %, at 256 30 %
    # with fp32 matmul results; 18 % with the bf16 ones a TPU uses by default).
    long = tiny.replace(max_len=256)
    runs = {
        "replicated": long.replace(sharding="replicated"),
        "replicated + remat layer": long.replace(sharding="replicated", remat="layer"),
        "fsdp data=2,fsdp=4 + remat dots + scan, 2 steps per call, fp32 ranking": tiny.replace(
            sharding="fsdp",
            mesh="data=2,fsdp=4",
            remat="dots",
            scan_layers=True,
            steps_per_call=2,
            log_every=2,
            precision="fp32",
            task="ranking",
        ),
        "shard_map + remat layer, ranking": tiny.replace(
            parallel="shard_map", remat="layer", task="ranking"
        ),
    }
    # The compiler's speed estimate (one more, unrolled, compilation) for one of them.
    reports = {
        name: pf_fit.check(cfg, "v3-8", devices, capacity, speed=name == "replicated")
        for name, cfg in runs.items()
    }
    reports["auto"] = pf_report.Report(**auto)
    for name, r in reports.items():
        assert r.device == "TPU v3", name
        assert r.fits and not r.error, name
        assert r.params > 0 and r.flops_per_step > 0 and r.compile_s > 0, name
        assert r.total >= r.params + r.optimizer + r.temporary, name
    for name in ("auto", "replicated"):  # the TPU compiler's estimate of the unrolled step
        r = reports[name]
        assert r.est_step_s > 0 and r.est_bytes_per_step > 0 and r.model_flops > 0, name
        assert r.peak_flops == 123e12 / 2, name  # v3: 123 TFLOP/s per chip, two cores
        assert r.remat_flops == 0, name
    rep = reports["replicated"]
    assert reports["auto"].params < rep.params / 6  # params and moments split over 8
    assert reports["auto"].optimizer < rep.optimizer / 6
    fsdp = reports["fsdp data=2,fsdp=4 + remat dots + scan, 2 steps per call, fp32 ranking"]
    assert fsdp.params < rep.params / 3  # params split over fsdp = 4
    # rematerialisation trades compute for activation memory
    remat = reports["replicated + remat layer"]
    assert remat.temporary < 0.87 * rep.temporary, (remat.temporary, rep.temporary)
    assert remat.flops_per_step > rep.flops_per_step
    # The same programs again (the estimate's memo of this process cleared): what the TPU
    # compiler said is read back (jaxtpu.preflight.memo), nothing is compiled, the same report
    pf_speed._ESTIMATES.clear()
    again = pf_fit.check(runs["replicated"], "v3-8", devices, capacity)
    assert again.extra["compile_remembered"] and again.compile_s > 0
    same = ("total", "eval_total", "temporary", "est_step_s", "est_bytes_per_step", "fits")
    assert {k: getattr(again, k) for k in same} == {k: getattr(rep, k) for k in same}


def test_model_flops_are_six_times_matmul_params_times_tokens_plus_attention():
    """BERT-base (12 x 768, FFN 3072), 32 comments of 128 tokens: 6 x 84,934,656 matmul
    parameters x 4,096 tokens + 12 x 12 layers x 768 x 128^2 x 32 for attention, about the
    2.17 TFLOP XLA counts for that step; `layer` remat adds one forward pass."""
    enc = RunSpec.resolve(presets.bert_base(), 1).encoder
    flops, recompute = enc.train_flops(32, 128, "none")
    matmul = 12 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert matmul == 84_934_656
    assert flops == 6 * matmul * 32 * 128 + 12 * 12 * 768 * 128**2 * 32
    assert recompute == 0 and enc.train_flops(32, 128, "dots")[1] == 0
    assert enc.train_flops(32, 128, "layer")[1] == (
        2 * matmul * 32 * 128 + 4 * 12 * 768 * 128**2 * 32
    )
    # EuroBERT: keys and values of 2 of 4 heads' width, a gated (SwiGLU) feed-forward
    euro = EncoderConfig.from_hf_dict(
        {
            "model_type": "eurobert",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": 100,
            "pad_token_id": 0,
        }
    )
    euro_matmul = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96)
    assert euro.train_flops(1, 8)[0] == 6 * euro_matmul * 8 + 12 * 2 * 64 * 8**2
    cfg = presets.bert_base().replace(task="ranking", batch_size=32, max_len=128)
    r = pf_report.Report("cpu", "zero1", "none", "data=1,fsdp=1", 32, 128)
    pf_speed.add_estimate(r, cfg, "cpu", [None], RunSpec.resolve(cfg, 1))
    assert r.model_flops == 2 * flops  # two comments per pair


@pytest.mark.model
def test_fsdp_holds_about_one_nth_of_the_state_per_device_on_the_cpu():
    devices, capacity = pf_targets.target_devices("cpu", 8)
    tiny = presets.tiny().replace(parallel="jit")
    rep = pf_fit.check(tiny.replace(sharding="replicated"), "cpu", devices, capacity)
    fsdp = pf_fit.check(tiny.replace(sharding="fsdp"), "cpu", devices, capacity)
    assert fsdp.device == rep.device == "cpu"
    state = lambda r: r.params + r.optimizer  # noqa: E731
    # all but the arrays under MIN_SPLIT elements (biases, LayerNorm) are split over 8
    assert state(fsdp) <= 1.1 * state(rep) / 8, (state(fsdp), state(rep))
    assert fsdp.flops_per_step == pytest.approx(rep.flops_per_step)


@pytest.mark.parametrize(
    "start, tolerance, found, tries",
    [
        (1, 0, 37, [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]),
        (4, 1 / 8, 36, [4, 8, 16, 32, 64, 48, 40, 36]),  # within 1/8: stops at (36, 40)
        (100, 0, 37, [100, 50, 25, 37, 43, 40, 38]),  # halving down from a batch too big
    ],
)
def test_find_batch_brackets_then_bisects(monkeypatch, start, tolerance, found, tries):
    tried = []

    def fake_check(cfg, target, devices, capacity, flops):
        assert not flops  # counted once, for the batch found
        tried.append(cfg.train.batch_size)
        r = pf_report.Report(target, "zero1", "none", "data=8,fsdp=1", cfg.train.batch_size, 16)
        r.fits = cfg.train.batch_size <= 37
        return r

    monkeypatch.setattr(pf_fit, "check", fake_check)
    monkeypatch.setattr(pf_fit, "flops_per_step", lambda cfg, devices: cfg.train.batch_size * 1e9)
    cfg = presets.tiny().replace(batch_size=start)
    best = pf_fit.find_batch(cfg, "cpu", [], 0, lambda r: None, tolerance)
    assert best.extra["largest_batch"] == best.batch_size == found
    assert best.flops_per_step == found * 1e9
    assert tried == tries
    assert "search_cap" not in best.extra and "cap" not in pf_report._largest(best)


def test_find_batch_says_when_it_stopped_at_its_own_cap(monkeypatch):
    """Issue 58: every batch up to the search's cap fitted, and preflight reported 'largest
    batch found 4096' as if it were the limit."""

    def fake_check(cfg, target, devices, capacity, flops):
        r = pf_report.Report(target, "zero1", "none", "data=8,fsdp=1", cfg.train.batch_size, 16)
        r.fits = True
        return r

    monkeypatch.setattr(pf_fit, "check", fake_check)
    monkeypatch.setattr(pf_fit, "flops_per_step", lambda cfg, devices: 1e9)
    best = pf_fit.find_batch(presets.tiny().replace(batch_size=1024), "cpu", [], 0, lambda r: 0)
    assert best.extra["largest_batch"] == pf_fit.MAX_BATCH == best.extra["search_cap"]
    assert pf_report._largest(best) == "4096 (the search's cap, 4096: larger may fit)"


def test_sweep_lists_are_checked():
    tiny = presets.tiny().replace(parallel="jit")
    assert [
        (c.placement.sharding, c.model.remat) for c in pf_fit.options(tiny, "zero1,fsdp+layer")
    ] == [("zero1", "none"), ("fsdp", "layer")]
    assert len(pf_fit.options(tiny, "all")) == 9
    with pytest.raises(ConfigError, match="'fsdp\\+fast' is not SHARDING"):
        pf_fit.options(tiny, "zero1,fsdp+fast")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--target", "v9-8"], "invalid choice: 'v9-8'"),
        (["--parallel", "jit", "--mesh", "data=3,fsdp=3"], "data x fsdp = 9, but the run has 8"),
        (["--parallel", "shard_map", "--sharding", "fsdp"], "--sharding fsdp needs --parallel jit"),
        (["--parallel", "pmap"], "invalid choice: 'pmap'"),
    ],
)
def test_bad_preflight_flags_are_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as e:
        pf_command.main(["--preset", "tiny", "--json", str(out), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err  # usage + the error
    assert not out.exists()


def test_an_unwritable_json_path_is_refused_before_any_compilation(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        pf_command.main(
            ["--preset", "tiny", "--target", "v3-8", "--json", str(tmp_path / "file" / "out.json")]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and "preflight:" not in err  # nothing compiled


@pytest.mark.compile
def test_a_topology_libtpu_does_not_know_is_one_line(monkeypatch):
    chip = TpuChip("TPU v9", 64, 1000, 1000, 1, "test")
    monkeypatch.setitem(pf_targets.TPU_TARGETS, "v9-8", pf_targets.Target("v9:2x2", chip, 8))
    with pytest.raises(DeviceError, match="cannot compile for TPU topology v9:2x2") as e:
        pf_targets.target_devices("v9-8", 8)
    assert "\n" not in str(e.value)


def _estimate(compiler_s: float) -> pf_speed.StepEstimate:
    return pf_speed.StepEstimate(compiler_s, 45e9, 0.0412, 30e9, 2e12)


def test_a_cost_model_without_a_usable_step_time_falls_back_to_the_roofline(monkeypatch):
    """A v3 cost model that gives no optimal_seconds, or a negative one: the roofline's time
    is the estimate, labelled as such (the model FLOPs are reported too), and the JSON keeps
    what the compiler said."""
    cfg = presets.bert_base()
    spec = RunSpec.resolve(cfg, 8)
    for seconds in (-650.9, 0.0):
        monkeypatch.setattr(pf_speed, "estimate", lambda c, d, t, x, s=seconds: _estimate(s))
        r = pf_report.Report("v3-8", "zero1", "none", "data=8,fsdp=1", 32, 128)
        pf_speed.add_estimate(r, cfg, "v3-8", [None] * 8, spec)
        assert (r.est_step_s, r.est_bytes_per_step, r.est_method) == (0.0412, 30e9, "roofline")
        assert r.compiler_step_s == seconds and r.model_flops > 0
        assert r.extra["no_compiler_estimate"] == f"its optimal_seconds is {seconds:.4g}"
        assert "| 0.0412 | roofline |" in pf_report.table([r], find=False)
    monkeypatch.setattr(pf_speed, "estimate", lambda c, d, t, x: _estimate(0.0491))
    r = pf_report.Report("v3-8", "zero1", "none", "data=8,fsdp=1", 32, 128)
    pf_speed.add_estimate(r, cfg, "v3-8", [None] * 8, spec)
    assert (r.est_step_s, r.est_method, r.roofline_step_s) == (0.0491, "compiler", 0.0412)
    assert "the TPU compiler's cost model" in pf_report.table([r], find=False)


@pytest.mark.parametrize("target", ["v4-8", "v5e-8", "v6e-8", "v5p-8"])
def test_a_generation_whose_cost_model_is_unusable_is_estimated_by_the_roofline(
    monkeypatch, target, capsys
):
    """libtpu's cost model gives real models negative step times on v4, v5e and v6e on a host
    without a TPU; even a positive one for a tiny model is not shown: the roofline's is, and
    the table, the log and the JSON say which method it is."""
    cfg = tiny()
    monkeypatch.setattr(pf_speed, "estimate", lambda c, d, t, x: _estimate(0.0031))
    r = pf_report.Report(target, "zero1", "none", "data=8,fsdp=1", 4, 16, global_batch=32)
    pf_speed.add_estimate(r, cfg, target, [None] * 8, RunSpec.resolve(cfg, 8))
    assert (r.est_step_s, r.est_method, r.compiler_step_s) == (0.0412, "roofline", 0.0031)
    kind = pf_targets.TPU_TARGETS[target].chip.device_kind
    assert r.extra["no_compiler_estimate"].startswith(f"its cost model is not validated for {kind}")
    table = pf_report.table([r], find=False)
    assert "| 0.0412 | roofline |" in table and "jaxtpu's roofline of the program" in table
    pf_report.say(r)
    assert "estimated by jaxtpu's roofline of the compiled program (not measured)" in (
        capsys.readouterr().err
    )


def test_the_epoch_and_the_run_are_the_estimated_step_times_their_steps(monkeypatch):
    """An epoch of 1,000 examples at a global batch of 8 x 16 is 7 steps (the run drops the
    partial last batch); a 3-epoch run 21; on Kaggle's v5e-8 the report says whether that
    fits a 9-hour session and the 20-hour week, judged at the high end of a range."""
    train = _examples(1000)
    cfg = tiny().replace(epochs=3, batch_size=16, max_len=16)
    r = pf_report.Report("v5e-8", "fsdp", "none", "data=1,fsdp=8", 16, 16, est_step_s=2.0)
    pf_speed.add_epoch(r, cfg, train, 8)
    assert (r.steps_per_epoch, r.run_steps) == (7, 21)
    assert (r.est_epoch_s, r.est_run_s) == (14.0, 42.0)
    assert r.extra["kaggle"].startswith("fits one Kaggle session (0.01 h of its 9 h")
    for step_s, verdict in [
        (9 * 3600 / 21 + 1, "does NOT fit one Kaggle session (9.0 h > 9 h): 2 sessions"),
        (20 * 3600 / 21 + 1, "does NOT fit Kaggle's limits: 20.0 h is more than a week's 20 h"),
    ]:
        r = pf_report.Report("v5e-8", "fsdp", "none", "", 16, 16, est_step_s=step_s)
        pf_speed.add_epoch(r, cfg, train, 8)
        assert r.extra["kaggle"].startswith(verdict), r.extra["kaggle"]
    r = pf_report.Report("v5e-8", "", "", "", 16, 16, est_step_s=1200.0, est_step_high_s=2400.0)
    pf_speed.add_epoch(r, cfg, train, 8)  # 7 to 14 hours
    assert (r.est_epoch_high_s, r.est_run_high_s) == (7 * 2400.0, 21 * 2400.0)
    assert r.extra["kaggle"] == (
        "does NOT fit one Kaggle session (14.0 h > 9 h): 2 sessions with --resume, within the "
        "20 h weekly quota; at the low end of the estimate (7.0 h) it would fit"
    )
    r = pf_report.Report("v6e-8", "fsdp", "none", "", 16, 16, est_step_s=2.0)
    pf_speed.add_epoch(r, cfg, train, 8)
    assert r.est_epoch_s == 14.0 and "kaggle" not in r.extra  # Kaggle's TPU is a v5e-8
    r = pf_report.Report("v5e-8", "fsdp", "none", "", 256, 16, est_step_s=2.0)
    pf_speed.add_epoch(r, cfg, train, 8)  # a batch of 2,048 is more than the data
    assert r.est_epoch_s == 0 and "larger than the 1000 training" in r.extra["no_epoch_estimate"]


def _examples(n: int):
    """`n` tokenized comments of 16 tokens each (what `training_examples` gives)."""
    import numpy as np

    from jaxtpu.core.data import tokenized

    ones = np.ones((n, 16), np.int32)
    return tokenized.Examples(ones, ones, np.zeros(n, np.float32))


def test_preflight_refuses_a_json_path_it_cannot_create_before_compiling(capsys):
    err = one_line_exit_2(
        capsys, lambda: pf_command.main(["--preset", "tiny", "--json", "/proc/jaxtpu-no/out.json"])
    )
    assert "cannot create anything in /proc" in err and "preflight:" not in err


def test_an_empty_sweep_is_refused():
    with pytest.raises(ConfigError, match="--sweep '': empty"):
        pf_fit.options(tiny(), "")
    assert pf_fit.options(tiny(), None) == [tiny()]


def test_find_batch_where_nothing_fits_says_so(monkeypatch):
    def refused(cfg, target, devices, capacity, flops):
        r = pf_report.Report(target, "zero1", "none", "data=8,fsdp=1", cfg.train.batch_size, 16)
        r.params, r.optimizer = 3 * 2**20, 6 * 2**20  # known before compiling (`check`)
        r.error = "RESOURCE_EXHAUSTED: out of memory"
        return r

    monkeypatch.setattr(pf_fit, "check", refused)
    best = pf_fit.find_batch(tiny().replace(batch_size=4), "v3-8", [], 0, lambda r: None)
    row = pf_report.table([best], find=True).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert "none (batch 1 refused)" in cells and "refused" in cells
    assert "3.0 MiB" in cells and "6.0 MiB" in cells  # the sizes that do not depend on the batch
    # not measured: temporary, eval step, GFLOP, and the eight speed columns
    assert cells.count("-") == 11


@pytest.mark.model
def test_a_configuration_the_compiler_refuses_still_reports_params_and_optimizer(monkeypatch):
    import jax

    def out_of_memory(self, *args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate 9 GiB")

    monkeypatch.setattr(jax.stages.Lowered, "compile", out_of_memory)
    r = pf_fit.check(tiny(), "cpu", jax.devices()[:8], 2**30, flops=False)
    assert r.error.startswith("RESOURCE_EXHAUSTED") and not r.fits
    # fp32 Adam: two moments per weight, split over the 8 devices by ZeRO-1 (the default)
    assert r.sharding == "zero1" and r.params > 0
    assert r.optimizer == pytest.approx(2 * r.params / 8, rel=0.01)


@pytest.mark.compile
def test_every_tpu_target_compiles_for_the_devices_it_is_known_by():
    """One device per chip on v5e, v6e and v5p (two per chip, one per TensorCore, on v2/v3 and
    as this libtpu compiles v4); single-host slices as one host (Kaggle's v5e-8, Colab's
    v5e-1), larger slices over several."""
    for name, tpu in pf_targets.TPU_TARGETS.items():
        devices, memory = pf_targets.target_devices(name, tpu.devices)
        assert len(devices) == tpu.devices and devices[0].device_kind == tpu.chip.device_kind
        assert memory == tpu.memory_per_device(), name
        hosts = len({d.process_index for d in devices})
        assert hosts == 1 if tpu.host_chips else hosts > 1 or tpu.chips <= 4, (name, hosts)
    assert pf_targets.TPU_TARGETS["v5e-8"].memory_per_device() == 16 * 2**30  # a chip each


@pytest.mark.compile
@pytest.mark.parametrize("target", ["v5e-1", "v5e-16"])
def test_colabs_v5e_1_and_a_multi_host_v5e_16_compile_a_run(target):
    n = pf_targets.TPU_TARGETS[target].devices
    devices, capacity = pf_targets.target_devices(target, n)
    r = pf_fit.check(tiny().replace(num_devices=n), target, devices, capacity, flops=False)
    assert r.fits and not r.error and r.params > 0
    assert r.mesh == ("data=1,fsdp=1" if n == 1 else f"data=1,fsdp={n}")  # the TPU default


@pytest.mark.compile
def test_find_batch_on_kaggles_v5e_8_estimates_the_epoch_and_the_session(
    tmp_path, capsys, monkeypatch
):
    """--find-batch on Kaggle's v5e-8 (from 32, doubling stopped at 64 here to keep it short:
    two compilations of the search and the estimate's): the
    largest batch, its step time by the roofline (a range, labelled), the epoch of the data
    the flags name (4,500 training comments of the 5,000-comment demo: 8 steps of 8 x 64) and
    whether the run fits a Kaggle session, in the log, the table and the JSON."""
    monkeypatch.setattr(pf_fit, "MAX_BATCH", 64)
    out = tmp_path / "v5e.json"
    flags = ["--preset", "tiny", "--target", "v5e-8", "--max-len", "32", "--batch-size", "32"]
    flags += ["--demo-size", "5000", "--find-batch", "--json", str(out)]
    assert pf_command.main(flags) == 0
    (r,) = json.loads(out.read_text())["reports"]
    assert r["extra"]["largest_batch"] == 64 and r["batch_size"] == 64 and r["fits"]
    assert r["est_method"] == "roofline" and 0 < r["est_step_s"] < r["est_step_high_s"]
    assert r["compiler_step_s"] != r["est_step_s"]  # the cost model's is kept, not used
    assert (r["steps_per_epoch"], r["run_steps"]) == (8, 8 * presets.tiny().train.epochs)
    assert r["est_epoch_s"] == pytest.approx(8 * r["est_step_s"])
    assert r["extra"]["kaggle"].startswith("fits one Kaggle session")
    printed = capsys.readouterr()
    assert "epochs estimated for 4500 train comments" in printed.err
    assert "largest batch found:" in printed.err and "fits one Kaggle session" in printed.err
    assert "| roofline |" in printed.out and "v5e-8: fits one Kaggle session" in printed.out


def test_the_epoch_estimate_reads_the_flags_data_and_does_without_it(tmp_path, capsys, monkeypatch):
    """The epoch comes from the training data the flags name (the demo's 230 training
    comments at 8 x 4 per step: 7 steps); data that cannot be read costs only the epoch
    estimate, said in one line, not the memory check (the target and its compilation faked
    here)."""

    def compiled(cfg, target, devices, capacity):
        r = pf_report.Report(target, "fsdp", "none", "data=1,fsdp=8", cfg.train.batch_size, 16)
        r.fits, r.est_step_s, r.est_method, r.global_batch = True, 0.5, "roofline", 32
        return r

    import jax

    monkeypatch.setattr(pf_command, "check", compiled)
    # this machine's 8 devices stand in for the v5e-8's (no topology is compiled for)
    monkeypatch.setattr(pf_command, "target_devices", lambda t, n: (jax.devices()[:8], 2**34))
    out = tmp_path / "v5e.json"
    base = ["--preset", "tiny", "--target", "v5e-8", "--json", str(out)]
    assert pf_command.main(base) == 0
    (r,) = json.loads(out.read_text())["reports"]
    assert (r["steps_per_epoch"], r["est_epoch_s"]) == (7, 3.5)
    assert "fits one Kaggle session" in r["extra"]["kaggle"]
    assert "epochs estimated for 230 train comments" in capsys.readouterr().err
    missing = tmp_path / "missing.csv"
    assert pf_command.main([*base, "--train-csv", str(missing)]) == 0
    (r,) = json.loads(out.read_text())["reports"]
    assert r["est_epoch_s"] == 0 and r["fits"]
    err = capsys.readouterr().err
    assert "preflight: no epoch estimate: " in err and str(missing) in err
