"""Compile here, train there: `preflight --save-programs DIR` saves every program of a run and
`train --programs DIR` loads them instead of compiling (on the CPU target here; a TPU target's
programs are refused on this machine, as another environment)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from jaxtpu import train
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags import presets
from jaxtpu.core.flags import schema as config
from jaxtpu.engine import programs
from jaxtpu.preflight import command as pf_command

# a schedule that decays over the run: its length (from the data) is a constant of the program
FLAGS = [
    "--preset",
    "tiny",
    "--buckets",
    "12,16",
    "--schedule",
    "linear",
    "--precision",
    "fp32",
    "--steps-per-call",
    "2",
    "--log-every",
    "2",
    "--max-steps",
    "6",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, config.Config]:
    """A run's programs saved for this machine's 8 devices, and that run's config."""
    root = tmp_path_factory.mktemp("programs")
    out = root / "programs"
    pf_command.main(
        [
            *FLAGS,
            "--target",
            "cpu",
            "--save-programs",
            str(out),
            "--json",
            str(root / "preflight.json"),
        ]
    )
    manifest = json.loads((out / programs.MANIFEST).read_text())
    return out, config.from_dict(manifest["config"])


def _losses(workdir: str) -> list[tuple[int, float]]:
    lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if r["event"] == "train"]


@pytest.mark.model
def test_a_run_from_saved_programs_compiles_nothing_and_trains_the_same(
    saved, tmp_path, monkeypatch
):
    from jax._src import compiler

    directory, cfg = saved
    manifest = json.loads((directory / programs.MANIFEST).read_text())
    assert sorted(p["describe"] for p in manifest["programs"]) == [
        "eval of length 12",
        "eval of length 16",
        "train call of length 12",
        "train call of length 16",
    ]
    compiles = []  # every XLA compilation of the process, persistent-cache hits included
    real = compiler.compile_or_get_cached
    monkeypatch.setattr(
        compiler,
        "compile_or_get_cached",
        lambda *a, **k: (
            compiles.append(str(a[1].operation.attributes["sym_name"])) or real(*a, **k)
        ),
    )
    a = train.train_and_evaluate(cfg.replace(workdir=str(tmp_path / "compiled")))
    compiled_here = len(compiles)
    b = train.train_and_evaluate(
        cfg.replace(workdir=str(tmp_path / "loaded"), programs=str(directory))
    )
    steps = ('"jit_train_steps"', '"jit_eval_step"')  # the train call's and the eval step's
    first, second = compiles[:compiled_here], compiles[compiled_here:]
    assert sorted(c for c in first if c in steps) == [steps[1]] * 2 + [steps[0]] * 2
    assert [c for c in second if c in steps] == []  # (the random init's weights still compile)
    assert (a["train_compiles"], b["train_compiles"]) == (2, 0)
    assert _losses(b["workdir"]) == _losses(a["workdir"]) and len(_losses(a["workdir"])) == 3
    assert b["final"]["val_loss"] == a["final"]["val_loss"]


@pytest.mark.model
def test_saved_programs_of_another_program_are_refused_in_one_line(saved, tmp_path):
    directory, cfg = saved
    message = r"length 1\d was compiled for another program \(flags differ: --lr 0\.001 \(saved"
    with pytest.raises(ConfigError, match=message) as e:
        train.train_and_evaluate(
            cfg.replace(workdir=str(tmp_path / "lr"), programs=str(directory), lr=1e-3)
        )
    assert "\n" not in str(e.value)
    assert not (tmp_path / "lr" / "metrics.jsonl").exists()  # refused before the first step


@pytest.mark.model
def test_saved_programs_of_another_environment_are_refused_in_one_line(saved, tmp_path):
    import jax

    directory, cfg = saved
    moved = tmp_path / "programs"
    moved.mkdir()
    manifest = json.loads((directory / programs.MANIFEST).read_text())
    manifest["environment"].update(jax="0.4.30", platform="tpu")
    (moved / programs.MANIFEST).write_text(json.dumps(manifest))
    devices = jax.devices()[:8]
    with pytest.raises(ConfigError) as e:
        programs.SavedPrograms(moved, devices, cfg)
    assert (
        f"compiled for another environment (jax '{jax.__version__}' (saved: '0.4.30'); "
        "platform 'cpu' (saved: 'tpu'))"
        in str(e.value)
        and "\n" not in str(e.value)
    )
    with pytest.raises(ConfigError, match="no programs.json; make it with"):
        programs.SavedPrograms(tmp_path / "none", devices, cfg)


def test_program_flags_are_checked_before_anything_runs(tmp_path, capsys):
    with pytest.raises(ConfigError, match="saved programs run under --parallel jit or shard_map"):
        presets.tiny().replace(programs="DIR", parallel="pmap")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for extra, message in [
        (["--sweep"], "--save-programs .*: saves one run's programs; leave out --sweep"),
        ([], "exists and holds no saved programs"),
    ]:
        with pytest.raises(SystemExit) as e:
            pf_command.main(
                [
                    "--preset",
                    "tiny",
                    "--save-programs",
                    str(taken),
                    *extra,
                    "--json",
                    str(tmp_path / "p.json"),
                ]
            )
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert re.search(message, err) and "preflight:" not in err, err
    assert (taken / "notes.txt").read_text() == "mine"


def test_the_program_hash_ignores_jaxs_private_function_names():
    """JAX numbers a module's private functions by what the process lowered before, and may
    repeat a body under a second name: the hash sees through both, not through a change."""

    class Text:
        def __init__(self, text: str) -> None:
            self.text = text

        def as_text(self) -> str:
            return self.text

    def module(names: tuple[str, str], op: str = "add") -> Text:
        a, b = names
        return Text(
            "module @jit_step {\n"
            f"  func.func public @main(%x: tensor<f32>) -> tensor<f32> {{\n"
            f"    %0 = call @{a}(%x) : (tensor<f32>) -> tensor<f32>\n"
            f"    %1 = call @{b}(%0) : (tensor<f32>) -> tensor<f32>\n"
            "    return %1 : tensor<f32>\n  }\n"
            + "".join(
                f"  func.func private @{n}(%y: tensor<f32>) -> tensor<f32> {{\n"
                f"    %0 = stablehlo.{op} %y, %y : tensor<f32>\n    return %0 : tensor<f32>\n  }}\n"
                for n in dict.fromkeys(names)
            )
            + "}\n"
        )

    h = programs.program_hash
    assert h(module(("_where", "_where"))) == h(module(("_where_6", "_where_7")))
    assert h(module(("_where", "_where"))) != h(module(("_where", "_where"), op="multiply"))
    assert np.unique([h(module(("f", "f"))), h(module(("g_1", "g_2")))]).size == 1
