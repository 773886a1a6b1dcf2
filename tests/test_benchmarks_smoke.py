"""A quick smoke check of the benchmark code (the benchmarks themselves are not run here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from benchmarks.shared import measured
from benchmarks.training import compare, worker
from jaxtpu.core import hostmem
from jaxtpu.core.hf.encoder import EncoderConfig
from parity_tests.harness import ROOT, clean_env


@pytest.mark.e2e
def test_worker_times_a_jaxtpu_step_and_reports_every_field():
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.training.worker",
        "--workload",
        "tiny",
        "--devices",
        "8",
        "--parallel",
        "pmap",
        "--seq",
        "16",
        "--min-steps",
        "2",
        "--max-steps",
        "2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(r["step_s"]) == 2 and r["median_s"] > 0 and r["compile_s"] > 0
    assert r["samples_per_s"] == 32 / r["median_s"]
    assert r["tokens_per_s"] == 32 * 16 / r["median_s"]
    assert r["peak_host_mb"] > 0


def test_model_flops_match_the_design_figure_for_minilm():
    enc = EncoderConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    )
    # DESIGN.md: "The model does about 275 GFLOP per step of this workload" (32 x 128).
    assert abs(worker.model_flops(enc, 32, 128) / 1e9 - 275) < 5


def test_quick_matrix_holds_the_target_rows():
    rows = compare.matrix(quick=True, all_configs=False)
    keys = {(r["framework"], r["parallel"], r["devices"]) for r in rows}
    assert {
        ("jaxtpu", "pmap", 8),
        ("jaxtpu", "jit", 8),
        ("jaxtpu", "shard_map", 8),
        ("torch_xla", "spmd", 8),
        ("torch", "eager", 1),
        ("torch", "compile", 1),
    } <= keys
    assert all(r["workload"] == "minilm" and r["precision"] == "bf16" for r in rows)
    assert {
        "framework": "jaxtpu",
        "parallel": "jit",
        "workload": "minilm",
        "precision": "bf16",
        "devices": 2,
        "steps_per_call": 8,
    } in rows
    # the memory options' rows
    assert {
        "framework": "jaxtpu",
        "parallel": "jit",
        "workload": "minilm",
        "precision": "bf16",
        "devices": 8,
        "sharding": "fsdp",
    } in rows
    assert {
        "framework": "jaxtpu",
        "parallel": "jit",
        "workload": "minilm",
        "precision": "bf16",
        "devices": 8,
        "remat": "layer",
    } in rows


@pytest.mark.e2e
def test_worker_reports_per_step_times_with_steps_per_call_and_memory_options():
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.training.worker",
        "--workload",
        "tiny",
        "--devices",
        "2",
        "--parallel",
        "jit",
        "--seq",
        "16",
        "--min-steps",
        "2",
        "--max-steps",
        "2",
        "--steps-per-call",
        "3",
        "--sharding",
        "fsdp",
        "--remat",
        "layer",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["steps_per_call"] == 3 and len(r["step_s"]) == 2
    assert (r["sharding"], r["remat"]) == ("fsdp", "layer")
    # a jaxtpu row restarts with malloc on huge pages, as jaxtpu's commands do, where it can
    machine = hostmem.glibc_version(), hostmem.thp_mode()
    huge = hostmem.active() or hostmem.wanted(os.environ, *machine)
    assert r["huge_pages"] is huge
    assert compare._strategy(r) == "jit/3+fsdp+remat" + ("+hp" if huge else "")
    assert r["samples_per_s"] == 32 / r["median_s"]


@pytest.mark.e2e
def test_model_gemms_ceiling_reports_the_step_matmul_flops():
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.training.worker",
        "--model-gemms",
        "--workload",
        "tiny",
        "--devices",
        "1",
        "--seq",
        "16",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    enc = EncoderConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    # the GEMMs are the model's FLOPs (the encoder's; the pooler and head are left out)
    assert abs(r["gemm_gflop"] * 1e9 - worker.model_flops(enc, 32, 16)) < 1e3
    assert r["gemm_gflops"] > 0 and r["ceiling_mfu"] == r["gemm_gflops"] / r["peak_gflops"]


@pytest.mark.e2e
def test_epoch_row_trains_every_bucket_and_projects_the_epoch_it_measured():
    """A whole (tiny) epoch of the packaged sample in buckets: the projection of a sample that
    is the whole epoch is what was measured, and there is one compilation per call shape
    (here with the programs loaded from the cache a first, untimed compilation filled)."""
    from jaxtpu.core.data.demo import SAMPLE_CSV

    cmd = [
        sys.executable,
        "-m",
        "benchmarks.training.epoch",
        "--workload",
        "tiny",
        "--batching",
        "bucketed",
        "--max-len",
        "64",
        "--num-batches",
        "1000",
        "--devices",
        "2",
        "--steps-per-call",
        "2",
        "--compile-cache",
        "warm",
        "--csv",
        str(SAMPLE_CSV),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["batches"] == r["epoch_batches"] == -(-2000 // 32)
    assert r["epoch_s"] == pytest.approx(r["compile_s"] + r["steady_s"], rel=1e-9)
    assert r["compiles"] == r["lengths"] >= 3 and r["compile_cache"] == "warm"
    assert r["tokens_vs_full_padding"] < 0.8 and 0 < r["padded_share"] < 0.5
    assert 0 <= r["data_wait_share"] < 1 and r["real_tokens_per_s"] > 0
    assert 0 < r["steady_cpu_cores"] <= r["cpu_count"] + 0.5


def test_epoch_table_compares_each_row_with_jaxtpu_padded():
    rows = [
        {
            "framework": "jaxtpu",
            "parallel": "jit",
            "batching": b,
            "max_len": 128,
            "epoch_s": t,
            "compile_s": 1.0,
            "real_tokens_per_s": 10.0,
            "tokens_vs_full_padding": 1.0,
            "lengths": 1,
            "compiles": 1,
            "data_wait_share": 0.0,
        }
        for b, t in (("padded", 100.0), ("bucketed", 55.0))
    ]
    table = compare.epoch_table(rows)
    assert " 1.00 " in table.splitlines()[2] and " 0.55 " in table.splitlines()[3]
    # a warm (second-run) row is compared with the warm padded row
    second = zip(rows, (80.0, 52.0), strict=True)
    warm = [{**r, "compile_cache": "warm", "epoch_s": t} for r, t in second]
    lines = compare.epoch_table(rows + warm).splitlines()
    assert "+warm" in lines[5] and " 0.65 " in lines[5] and " 0.55 " in lines[3]


def test_epoch_max_len_runs_only_that_lengths_rows(tmp_path, monkeypatch):
    seen = []

    def fake_worker(flags, timeout, module="worker"):
        seen.append(int(flags[flags.index("--max-len") + 1]))
        return {"error": "not run"}

    monkeypatch.setattr(compare, "run_worker", fake_worker)
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    kept = tmp_path / "epoch-256.json"
    flags = ["--out", str(tmp_path), "--epoch", "--epoch-max-len", "256", "--report", str(kept)]
    assert compare.main(flags) == 0
    assert seen == [256] * len(compare.EPOCH_ROWS)
    saved = json.loads((tmp_path / "epoch.json").read_text())["results"]
    assert [r["max_len"] for r in saved] == seen
    # --report keeps the same rows as a report of kind epoch, each failed row said as such
    record = json.loads(kept.read_text())
    assert record["kind"] == "epoch" and record["report"]["results"] == saved
    assert measured.render(kept).count("error: not run") == len(compare.EPOCH_ROWS)
    with pytest.raises(SystemExit):  # a projected epoch is not kept
        compare.main([*flags, "--epoch-batches", "4"])


def test_epoch_resume_runs_only_the_rows_an_interrupted_run_left(tmp_path, monkeypatch, capsys):
    calls = []

    def worker(fail_at):
        def fake(flags, timeout, module="worker"):
            calls.append(len(calls) + 1)
            if len(calls) == fail_at:
                return {"error": "killed"}
            at = flags.index("--compile-cache") + 1 if "--compile-cache" in flags else None
            cache = flags[at] if at else None
            row = {"compile_cache": cache, "epoch_s": 10.0 * len(calls), "compile_s": 1.0}
            keys = ("real_tokens_per_s", "tokens_vs_full_padding", "lengths", "compiles")
            return {**row, **dict.fromkeys(keys, 1), "data_wait_share": 0.0}

        return fake

    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    flags = ["--out", str(tmp_path), "--epoch", "--epoch-max-len", "256"]
    monkeypatch.setattr(compare, "run_worker", worker(fail_at=4))
    assert compare.main(flags) == 0
    first = json.loads((tmp_path / "epoch.json").read_text())["results"]
    calls.clear()
    monkeypatch.setattr(compare, "run_worker", worker(fail_at=0))
    kept = tmp_path / "epoch-256.json"
    assert compare.main([*flags, "--resume", "--report", str(kept)]) == 0
    n = len(compare.EPOCH_ROWS)
    assert calls == list(range(1, n - 3 + 1))  # rows 4..n only: the failed row runs again
    results = json.loads(kept.read_text())["report"]["results"]
    assert results[:3] == first[:3] and "error" not in results[3] and len(results) == n
    assert {r["commit"] for r in results} == {"0123abcdef"}  # each row names its code
    # a report keeps one commit's rows: resuming at another, or with changes, is refused
    (tmp_path / "epoch.json").write_text(json.dumps({"num_batches": 0, "seconds": 1.0,
                                                     "results": first[:3]}))  # fmt: skip
    for code, why in [("fedcba9876", "rows computed at 0123abcdef, this run is at fedcba9876"),
                      ("0123abcdef+changes", "(0123abcdef+changes) is not a commit")]:  # fmt: skip
        monkeypatch.setattr(measured, "commit", lambda code=code: code)
        with pytest.raises(SystemExit) as e:  # before any row runs
            compare.main([*flags, "--resume", "--report", str(tmp_path / "other.json")])
        assert e.value.code == 2 and why in capsys.readouterr().err and len(calls) == n - 3
    monkeypatch.setattr(measured, "commit", lambda: "fedcba9876")
    assert compare.main([*flags, "--resume"]) == 0  # no report: kept, and said so
    assert "computed at 0123abcdef; this run: fedcba9876" in capsys.readouterr().out
    # a resume of a finished run runs nothing; of another length, everything
    calls.clear()
    assert compare.main([*flags, "--resume"]) == 0 and calls == []
    assert compare.main([*flags[:-1], "128", "--resume"]) == 0 and len(calls) == n
    with pytest.raises(SystemExit):  # the other benchmarks keep no rows
        compare.main(["--out", str(tmp_path), "--resume"])
    (tmp_path / "epoch.json").write_text("{not json")  # a damaged record: one line, kept
    with pytest.raises(SystemExit, match="epoch.json is not an epoch run's record"):
        compare.main([*flags, "--resume"])
    assert (tmp_path / "epoch.json").read_text() == "{not json"


def test_tpu_tuning_swaps_each_change_in_and_back_out():
    """benchmarks.training.tpu_tuning's variants: kernels swapped for the block only, flags as
    config overrides, '+' joins changes, an unknown one is refused."""
    from benchmarks.training import tpu_tuning
    from jaxtpu.models import layers, ops

    gelu, layer_norm = ops.gelu, layers.layer_norm
    with tpu_tuning.swapped("gelu=tanh+matmul_out=bf16+sharding=fsdp") as overrides:
        assert ops.gelu is not gelu and layers.layer_norm is layer_norm
        assert overrides == {"matmul_output": "bf16", "sharding": "fsdp"}
    assert ops.gelu is gelu
    with tpu_tuning.swapped("tpu") as overrides:
        assert overrides == {"matmul_output": "auto", "sharding": "auto"}
    with pytest.raises(SystemExit, match="unknown variant gelu=fast"):
        with tpu_tuning.swapped("gelu=fast"):
            pass


@pytest.mark.model
def test_local_attention_times_both_forms_of_the_sliding_window(capsys, monkeypatch):
    """The CPU half of benchmarks.training.local_attention on one short length (a sliding layer of
    ModernBERT-base's width; the TPU estimate is left out here)."""
    from benchmarks.training import local_attention

    monkeypatch.setattr(local_attention, "TOKENS", 128)
    assert local_attention.main(["--lengths", "128", "--repeats", "1", "--no-tpu"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 128 |")]
    cells = [c.strip() for c in row[-1].strip("|").split("|")]
    assert cells[1] == "1" and float(cells[2]) > 0 and float(cells[3]) > 0
    assert cells[4].endswith("x") and cells[5:] == ["-", "-", "-"]


def test_estimates_table_of_prints_saved_reports_in_target_and_model_order():
    from benchmarks.training import estimates
    from jaxtpu.preflight.report import Report

    def saved(model: str, target: str, length: int, step: float) -> dict:
        r = Report(target, "fsdp", "none", "data=1,fsdp=8", 8, length, total=2**30)
        r.fits, r.est_step_s, r.est_method, r.global_batch = True, step, "roofline", 64
        return {"model": model, **r.__dict__}

    base, large = "ModernBERT-base (22 x 768)", "ModernBERT-large (28 x 1024)"
    rows = [saved(large, "v5e-8", 512, 0.3), saved(base, "v6e-8", 512, 0.1)]
    rows += [saved(base, "v5e-8", 1024, 0.2), saved(base, "v5e-8", 512, 0.1)]
    table = estimates.table_of(rows, ["v5e-8", "v6e-8"]).splitlines()
    order = [(c[1].strip(), c[2].strip(), c[3].strip()) for c in (t.split("|") for t in table[2:])]
    assert order == [
        (base, "v5e-8", "512"),
        (base, "v5e-8", "1024"),
        (large, "v5e-8", "512"),
        (base, "v6e-8", "512"),
    ]
    # the epoch: ceil(159,571 / 64) steps of 0.1 s = 4.2 min
    assert "0.1000" in table[2] and "roofline" in table[2] and table[-1].endswith("| 4.2 |")


def test_estimates_configs_writes_each_published_shape_as_a_model_dir(tmp_path, capsys):
    """`--configs DIR`: a directory per shape holding only its config.json, which jaxtpu reads
    as that shape (DeBERTa-v3-large: the base's options, 24 x 1024)."""
    from benchmarks.training import estimates
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.flags.schema import Config

    assert estimates.main(["--configs", str(tmp_path / "configs")]) == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[-1] for p in printed] == list(estimates.CONFIGS)
    cfg = Config().replace(model_dir=str(tmp_path / "configs" / "deberta-v3-large"), max_len=224)
    encoder = RunSpec.resolve(cfg).encoder
    shape = (encoder.model_type, encoder.num_hidden_layers, encoder.hidden_size)
    assert shape == ("deberta-v2", 24, 1024)
    assert encoder.vocab_size == 128100 and encoder.relative_attention
    # a DIR that cannot be made is one line, exit 2
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        estimates.main(["--configs", str(tmp_path / "file" / "configs")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--configs" in err and "cannot write there" in err


def test_decoders_table_row_gives_the_largest_batch_and_the_rules_epoch():
    from benchmarks.training import decoders
    from jaxtpu.preflight.report import Report

    r = Report("v5e-8", "fsdp", "layer", "data=1,fsdp=8", 12, 512, total=15 * 2**30)
    r.params, r.optimizer, r.capacity = 3 * 2**30, 2**27, 16 * 2**30
    r.fits, r.est_step_s, r.est_step_high_s = True, 1.0, 2.0
    r.extra["largest_batch"] = 12  # on 8 chips: 96 comments a step
    cells = [c.strip() for c in decoders.row({"model": "Qwen3-14B", **r.__dict__}).split("|")]
    # ceil(2,029 / 96) = 22 steps of 1-2 s: 0.4-0.7 min; 96 comments in 1-2 s: 48-96 /s
    assert cells[1:6] == ["Qwen3-14B", "v5e-8", "512", "12", "3.00 GiB"]
    assert cells[9:12] == ["1.000-2.000", "48-96", "0.4-0.7"]
    refused = Report("v5e-1", "fsdp", "layer", "data=1,fsdp=1", 1, 512, error="RESOURCE_EXHAUSTED")
    cells = [c.strip() for c in decoders.row({"model": "Qwen3-4B", **refused.__dict__}).split("|")]
    assert cells[4] == "none (refused at 1)" and cells[9] == "-"
    r.est_step_s = r.est_step_high_s = 0.0  # --no-speed: memory and batch, no estimate
    cells = [c.strip() for c in decoders.row({"model": "Qwen3-8B", **r.__dict__}).split("|")]
    assert cells[4] == "12" and cells[9:12] == ["-", "-", "-"]
    assert [m for m, t in decoders.ROWS if t == "v5e-1"] == ["Qwen3-4B"]


def test_the_decoders_step_estimate_is_affine_in_the_layer_count():
    from benchmarks.training import decoders
    from jaxtpu.preflight.report import Report

    def cut(step, high, flops):
        r = Report("v5e-8", "fsdp", "layer", "data=1,fsdp=8", 12, 512, est_method="roofline")
        r.est_step_s, r.est_step_high_s, r.roofline_step_s = step, high, step
        r.est_bytes_per_step, r.model_flops, r.remat_flops = 10.0 * step, flops, flops / 3
        return r

    # 2 layers 1.0 s, 4 layers 1.5 s: 0.25 s a layer on 0.5 s of the rest; 40 layers: 10.5 s
    whole = decoders._layer_fit(cut(1.0, 1.2, 6.0), cut(1.5, 1.8, 10.0), {"num_hidden_layers": 40})
    assert whole.est_step_s == 10.5 and whole.est_step_high_s == pytest.approx(12.6)
    assert whole.est_bytes_per_step == 105.0 and whole.model_flops == 82.0  # 2 a layer + 2
    assert whole.est_method.startswith("roofline, affine in the layer count (2 and 4 layers")
    assert whole.extra["layer_fit"] == {"2": [1.0, 1.2], "4": [1.5, 1.8]}
    whole.fits, whole.extra["largest_batch"] = True, 12
    cells = [c.strip() for c in decoders.row({"model": "Qwen3-14B", **whole.__dict__}).split("|")]
    assert cells[9] == "10.500-12.600†"  # the table marks an estimate drawn from the fit


@pytest.fixture
def fake_decoders(monkeypatch, tmp_path):
    """benchmarks.training.decoders with a fake search and estimate (nothing compiles) at commit
    0123abcdef: returns the lists of what was searched and estimated. Its temporary folders go
    under tmp_path/tmp, which must be empty again when the test ends."""
    from benchmarks.training import decoders
    from jaxtpu.preflight import fit as pf_fit
    from jaxtpu.preflight import targets as pf_targets
    from jaxtpu.preflight.report import Report

    searched, estimated = [], []

    def find_batch(cfg, target, devices, capacity, say, speed):
        searched.append((target, cfg.data.max_len, speed))
        r = Report(target, "fsdp", "layer", "data=1,fsdp=8", 4, cfg.data.max_len, fits=True)
        r.extra["largest_batch"] = 4
        return r

    def fake_estimate(root, saved, devices, layers=0):
        estimated.append((saved["target"], saved["max_len"], layers))
        fields = {k: v for k, v in saved.items() if k != "model"}
        return Report(**{**fields, "est_step_s": 1.0 + layers, "est_method": "roofline"})

    monkeypatch.setattr(pf_fit, "find_batch", find_batch)
    monkeypatch.setattr(pf_targets, "target_devices", lambda target, n: ([], 16 << 30))
    monkeypatch.setattr(decoders, "_estimated", fake_estimate)
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")  # git: a process
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield searched, estimated
    assert not list(scratch.iterdir()), "the benchmark left its temporary folders behind"


def test_decoders_estimate_searches_what_out_lacks_and_reports_only_its_own_rows(
    tmp_path, fake_decoders, capsys
):
    """`--estimate --targets T --out F --report R` makes a target's rows from nothing in one
    process (the search without speed, then the estimate), so the report's command is all it
    took; rows of --out it did not compute are not kept, and a --report run whose --out
    already has one of its rows is refused before any work. Compiles nothing: the search and
    the estimate are fakes here."""
    from benchmarks.training import decoders
    from jaxtpu.preflight.report import Report

    searched, estimated = fake_decoders
    out, kept = tmp_path / "rows.json", tmp_path / "kept.json"
    other = {
        "model": "Qwen3-4B",
        **Report("v6e-8", "fsdp", "layer", "data=1,fsdp=8", 4, 256).__dict__,
    }
    out.write_text(json.dumps([other]))  # an earlier run's row of another target
    args = ["--estimate", "--targets", "v5e-8", "--models", "Qwen3-4B", "--out", str(out)]
    assert decoders.main([*args, "--report", str(kept)]) == 0
    assert searched == [("v5e-8", 256, False), ("v5e-8", 512, False)]  # memory only
    assert estimated == [("v5e-8", n, k) for n in (256, 512) for k in decoders.FIT_LAYERS]
    rows = json.loads(kept.read_text())["report"]
    assert [(r["target"], r["max_len"]) for r in rows] == [("v5e-8", 256), ("v5e-8", 512)]
    assert all(decoders.FIT_NOTE in r["est_method"] for r in rows)
    assert {r["extra"]["commit"] for r in rows} == {"0123abcdef"}  # each row names its code
    assert len(json.loads(out.read_text())) == 3  # --out keeps every row
    with pytest.raises(SystemExit) as e:  # --out has this run's rows now: not kept again
        decoders.main([*args, "--report", str(tmp_path / "again.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "already has 2 of them: give a new --out" in err, err
    assert not (tmp_path / "again.json").exists() and len(searched) == 2
    with pytest.raises(SystemExit) as e:
        decoders.main(["--estimate"])
    assert e.value.code == 2 and "give --out FILE" in capsys.readouterr().err


def test_decoders_resume_finishes_an_interrupted_report_run_of_the_same_commit(
    tmp_path, fake_decoders, monkeypatch, capsys
):
    """A `--report` run killed after its first row's search is finished by the same command
    with `--resume`: the finished row is kept (not searched again, but estimated, which it
    was not yet) and the report holds both rows and says --resume. Rows of another commit,
    of no named commit, or a checkout with changes are refused before any work."""
    from benchmarks.training import decoders

    searched, estimated = fake_decoders
    out, kept = tmp_path / "rows.json", tmp_path / "kept.json"
    args = ["--targets", "v5e-8", "--models", "Qwen3-4B", "--out", str(out)]
    assert decoders.main([*args, "--lengths", "256", "--no-speed"]) == 0  # the killed run's row
    assert estimated == [] and len(searched) == 1
    args = ["--estimate", *args]
    for code, said in [
        ("fedcba9876", "rows computed at 0123abcdef, this run is at fedcba9876"),
        ("0123abcdef+changes", "(0123abcdef+changes) is not a commit"),
    ]:
        monkeypatch.setattr(measured, "commit", lambda code=code: code)
        with pytest.raises(SystemExit) as e:
            decoders.main([*args, "--resume", "--report", str(kept)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and said in err, err
    assert len(searched) == 1 and not kept.exists()
    monkeypatch.setattr(measured, "commit", lambda: "0123abcdef")
    assert decoders.main([*args, "--resume", "--report", str(kept)]) == 0
    assert searched == [("v5e-8", 256, False), ("v5e-8", 512, False)]  # 256 not again
    assert estimated == [("v5e-8", n, k) for n in (256, 512) for k in decoders.FIT_LAYERS]
    record = json.loads(kept.read_text())
    assert [r["max_len"] for r in record["report"]] == [256, 512]
    assert "--resume" in record["command"]
    unnamed = json.loads(out.read_text())
    del unnamed[0]["extra"]["commit"]  # an --out of a run before rows named their commit
    out.write_text(json.dumps(unnamed))
    with pytest.raises(SystemExit) as e:
        decoders.main([*args, "--resume", "--report", str(tmp_path / "k2.json")])
    assert e.value.code == 2 and "computed at an unnamed commit" in capsys.readouterr().err


def test_scoring_summary_takes_each_ways_median_and_spread_and_the_ratios_from_them():
    from benchmarks.serving import scoring

    def row(way, per_s, rss, auc=0.97, **extra):
        return {"way": way, "per_s": per_s, "wall_s": 10.0, "peak_rss_gb": rss, "auc": auc,
                "diff": 0.001, "score_s": 1.0, **extra}  # fmt: skip

    rounds = [
        row("pipeline-fp32", 60.0, 1.0), row("onnx-fp32", 150.0, 1.1),
        row("onnx-int8", 240.0, 1.0, auc=0.968), row("pipeline-bf16", 170.0, 1.2),
        row("jaxtpu-api", 200.0, 1.4, first_s=30.0),
        row("pipeline-fp32", 90.0, 1.3), row("onnx-fp32", 120.0, 1.0),
        row("onnx-int8", 250.0, 1.0, auc=0.968), row("pipeline-bf16", 180.0, 1.1),
        row("jaxtpu-api", 100.0, 1.5, first_s=40.0),
        row("pipeline-fp32", 70.0, 1.0), row("onnx-fp32", 140.0, 1.0),
        row("onnx-int8", 280.0, 1.0, auc=0.968), row("pipeline-bf16", 175.0, 1.0),
        row("jaxtpu-api", 175.0, 1.45, first_s=35.0),
    ]  # fmt: skip
    rows = {r["way"]: r for r in scoring.summary(rounds)}
    assert list(rows) == ["pipeline-fp32", "onnx-fp32", "onnx-int8", "pipeline-bf16", "jaxtpu-api"]
    api = rows["jaxtpu-api"]
    assert (api["per_s"], api["per_s_min"], api["per_s_max"]) == (175.0, 100.0, 200.0)
    assert api["peak_rss_gb"] == 1.5 and api["first_s"] == 35.0 and api["rounds"] == 3
    assert rows["pipeline-fp32"]["first_s"] is None
    text = scoring.table(list(rows.values()))
    assert "onnxruntime fp32 over PyTorch eager fp32: 2.00x" in text  # 140 / 70
    assert "onnxruntime int8 over onnxruntime fp32: 1.79x" in text  # 250 / 140
    assert "int8's held-out AUC loss: 0.0020" in text
    assert "jaxtpu.load().predict over PyTorch bf16 autocast: 1.00x" in text  # 175 / 175
    assert "| jaxtpu-api | 175 | 100-200 | 35.0 |" in text
    assert text.endswith("CPU: not recorded (a result written before tables recorded it)")


def test_every_benchmark_table_says_which_cpu_it_ran_on():
    """Issue 65 item 6: the CPU's model, cores and the flags that change the kernels, read from
    /proc/cpuinfo's text, under the scoring, serving and training tables."""
    from benchmarks.serving import scoring
    from benchmarks.shared.machine import cpu_line, cpu_record

    info = "model name\t: Some CPU\nflags\t\t: fpu sse avx512f avx512_vnni amx_tile\n"
    cpu = cpu_record(info)
    assert cpu["model"] == "Some CPU" and cpu["flags"] == ["avx512f", "avx512_vnni", "amx_tile"]
    line = cpu_line(cpu)
    assert line == f"CPU: Some CPU, {os.cpu_count()} cores, flags avx512f, avx512_vnni, amx_tile"
    assert cpu_line(cpu_record("model name : Old\nflags : fpu sse2\n")).endswith(
        "flags none of avx512f, avx512_vnni, avx512_bf16, amx_bf16, amx_int8, amx_tile"
    )
    # one name, two generations: the family, model and clock tell them apart when listed
    zen4 = "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.128\n"
    assert cpu_line(cpu_record(zen4)).startswith("CPU: AMD EPYC (family/model 25/17, 2,596 MHz), ")
    row = {"way": "onnx-fp32", "per_s": 1.0, "wall_s": 1.0, "peak_rss_gb": 1.0, "auc": 0.9}
    row |= {"diff": 0.0, "cpu": cpu}
    assert scoring.table(scoring.summary([row])).endswith(line)
    assert compare.table([], {"bf16": 1.0}, cpu).endswith(line)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--workdir", "no-such-run"], "--workdir no-such-run: not a finished jaxtpu run"),
        (["--table"], "--table: no"),
        (["--out-is-a-file"], "a file; give a directory"),
    ],
)
def test_the_benchmarks_refuse_bad_flags_in_one_line_before_any_work(
    tmp_path, capsys, flags, words
):
    from benchmarks.serving import scoring
    from benchmarks.serving import throughput as serving

    out = tmp_path / "out"
    if flags == ["--out-is-a-file"]:
        out.write_text("x")
        flags = []
    comments = tmp_path / "comments.csv"  # the refusals need no real comments (../shared)
    comments.write_text("id,comment_text,toxic\n1,a comment,0\n")
    with pytest.raises(SystemExit) as e:
        scoring.main(["--out", str(out), "--csv", str(comments), *flags])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "out" / "run").exists()  # nothing trained
    with pytest.raises(SystemExit, match="not a jaxtpu run directory"):
        serving.main(["--workdir", str(tmp_path / "typo"), "--out", str(tmp_path / "s")])
    from benchmarks.serving import clients as serve_clients

    with pytest.raises(SystemExit) as e:
        serve_clients.main(["--workdir", str(tmp_path / "typo"), "--out", str(tmp_path / "c")])
    assert e.value.code == 2 and "not a jaxtpu run directory" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
