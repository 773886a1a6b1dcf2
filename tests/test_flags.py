"""The flag schema (`jaxtpu.core.flags`): every numeric flag bounded, config files and
`--print-config`, a run's config.json rerun exactly, and bad flag values refused in one line
on both sides."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from helpers import (
    SIDE_MAINS,
    exit_in_process,
    one_line_exit_2,
    side_main,
)

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.cli import parse_args
from jaxtpu.core.flags.configfile import read_config_file
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.schema import BOUNDS, FIELDS, JAX_ONLY, RESUME_MAY_CHANGE
from jaxtpu.core.hf.encoder import read_encoder
from parity_tests.harness import ROOT, clean_env

NUMERIC = sorted(name for name, (_, f) in FIELDS.items() if f.type in ("int", "float"))


PROBES = [math.nan, math.inf, -math.inf, 0, -1, 10**30]


def test_the_docs_name_the_flags_the_schema_lets_change_on_resume_and_keeps_for_jax():
    """The documentation's two lists of flags are generated from the fields' own metadata
    (docs/hooks.py): which may change on --resume, and which the torch side refuses."""
    from jaxtpu.core.flags.cli import flag_list

    assert "<!-- flags:resume -->" in (ROOT / "docs" / "run-directory.md").read_text()
    assert "<!-- flags:jax-only -->" in (ROOT / "docs" / "commands.md").read_text()

    def named(text: str) -> set[str]:
        return {m.replace("-", "_") for m in re.findall(r"`--([a-z-]+)`", text)}

    assert named(flag_list("resume")) == RESUME_MAY_CHANGE - {"resume"}
    assert named(flag_list("jax-only")) == set(JAX_ONLY)
    assert re.fullmatch(r"(`--[a-z-]+`, )+`--[a-z-]+` and `--[a-z-]+`", flag_list("jax-only"))


def test_every_numeric_flag_has_bounds():
    assert set(NUMERIC) == set(BOUNDS), set(NUMERIC) ^ set(BOUNDS)


@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_flag_accepts_or_refuses_nan_inf_zero_negative_huge(name):
    """In-process, no training: each probe is either a valid config or a ConfigError whose
    message is one line naming the flag; never another exception."""
    for probe in PROBES:
        try:
            cfg = tiny().replace(**{name: probe})
        except ConfigError as e:
            text = str(e)
            assert "\n" not in text and text.startswith((f"--{name.replace('_', '-')} ", name))
            continue
        got = getattr(getattr(cfg, FIELDS[name][0]), name)
        assert math.isfinite(got), (name, probe, got)
        assert BOUNDS[name].problem(got) is None


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--num-heads", "0"], "--num-heads must be >= 1, got 0"),
        (["--hidden-size", "0"], "--hidden-size must be >= 1, got 0"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--pairs-per-comment", "0"], "--pairs-per-comment must be > 0, got 0.0"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
        (["--dropout", "nan"], "--dropout must be a finite number in [0, 1) or -1, got nan"),
    ],
)
@pytest.mark.parametrize(
    "side", ["jax", pytest.param("torch", marks=pytest.mark.torch)]
)  # the torch side's command imports torch: outside the fast tier
def test_bad_flag_values_are_refused_identically_on_both_sides(
    tmp_path, capsys, side, flags, message
):
    """Each side's command in this process (the flags are refused before anything starts)."""
    main = side_main(side)
    code, err = exit_in_process(capsys, lambda: main("--workdir", tmp_path / "run", *flags))
    assert code == 2 and message in err
    assert not (tmp_path / "run").exists()


def test_eager_is_not_a_jax_strategy(tmp_path, capsys):
    main = side_main("jax")
    code, err = exit_in_process(
        capsys, lambda: main("--workdir", tmp_path / "run", "--parallel", "eager")
    )
    assert code == 2 and "invalid choice: 'eager'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "holds a JSON list, expected an object"),
    ],
)
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, text, message, capsys):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_encoder(str(tmp_path))
    for side in SIDE_MAINS:  # both commands, before anything is created
        wd = tmp_path / f"run-{side}"
        err = one_line_exit_2(
            capsys,
            lambda s=side, w=wd: SIDE_MAINS[s](
                ["--preset", "tiny", "--model-dir", str(tmp_path), "--workdir", str(w)]
            ),
        )
        assert f"{tmp_path / 'config.json'}: {message.split(',')[0]}" in err
        assert not wd.exists()


def _parse(*argv: str):
    return parse_args(list(argv), prog="t", description="t")


def test_a_config_file_sets_flags_and_the_command_line_overrides_it(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("task: ranking\noptim:\n  lr: 1e-4\n  adam-eps: 1.0e-6\nbatch_size: 8\n")
    cfg = _parse("--preset", "tiny", "--config", str(yaml_file), "--batch-size", "2")
    assert (cfg.train.task, cfg.optim.lr, cfg.optim.adam_eps) == ("ranking", 1e-4, 1e-6)
    assert cfg.train.batch_size == 2  # the command line wins
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps({"lr": 2e-4}))
    assert _parse("--preset", "tiny", "--config", str(as_json)).optim.lr == 2e-4


@pytest.mark.parametrize(
    "text, message",
    [
        ("lrr: 1e-4\n", "unknown key 'lrr'"),
        ("batch_size: many\n", "batch_size='many' is not a valid int"),
        ("epochs: 1.5\n", "epochs=1.5 is not a valid int"),
        ("- a\n- b\n", "expected a mapping of flag names to values"),
        ("task: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_are_one_line_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as e:
        read_config_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e
def test_a_runs_config_json_reruns_it_exactly(tmp_path):
    """A run directory's config.json is a --config: the rerun's losses are the run's."""
    first, second = tmp_path / "first", tmp_path / "second"
    args = [
        "--preset",
        "tiny",
        "--max-steps",
        "4",
        "--log-every",
        "1",
        "--lr",
        "7e-4",
        "--num-devices",
        "8",
        "--no-progress",
    ]

    def run(*argv):
        command = [sys.executable, "-m", "jaxtpu", "train", *argv]
        proc = subprocess.run(
            command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    run(*args, "--workdir", str(first))
    run("--config", str(first / "config.json"), "--workdir", str(second))

    def losses(wd):
        lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
        return [x["loss"] for x in lines if x["event"] == "train"]

    recorded = json.loads((second / "config.json").read_text())["config"]
    assert recorded["optim"]["lr"] == 7e-4 and recorded["train"]["max_steps"] == 4
    assert losses(first) == losses(second) and len(losses(first)) == 4


def test_print_config_writes_a_file_that_gives_back_the_same_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(
            "--preset", "lightning-severity", "--model-dir", "m", "--lr", "2e-5", "--print-config"
        )
    assert e.value.code == 0
    path = tmp_path / "lightning.yaml"
    path.write_text(capsys.readouterr().out)
    assert _parse("--config", str(path)) == _parse(
        "--preset", "lightning-severity", "--model-dir", "m", "--lr", "2e-5"
    )
    # a preset's required model directory is a placeholder, never a silent random init
    with pytest.raises(SystemExit):
        _parse("--preset", "xla-notebook", "--print-config")
    text = capsys.readouterr().out
    assert "model_dir: 'SET-ME: the pretrained model directory'" in text


@pytest.mark.parametrize(
    "text, expected",
    [("0", (0, 0.0)), ("500", (500, 0.0)), ("30m", (0, 1800.0)), ("1.5h", (0, 5400.0)),
     ("90s", (0, 90.0)), (" 2H ", (0, 7200.0))],
)  # fmt: skip
def test_checkpoint_every_is_steps_or_a_time_interval(text, expected):
    from jaxtpu.core.flags.schema import checkpoint_interval

    assert checkpoint_interval(text) == expected


@pytest.mark.parametrize("text", ["-1", "1.5", "0h", "-2m", "nanh", "infs", "1d", "h", ""])
def test_a_checkpoint_interval_that_is_neither_is_refused(text):
    with pytest.raises(ConfigError, match="expected a step count .* or a time interval"):
        tiny().replace(checkpoint_every=text)


def test_a_config_file_may_give_checkpoint_every_as_a_number(tmp_path):
    assert tiny().replace(checkpoint_every=500).output.checkpoint_every == "500"
    with pytest.raises(ConfigError, match="not a multiple of --steps-per-call 4"):
        tiny().replace(checkpoint_every=6, steps_per_call=4, log_every=4)
    tiny().replace(checkpoint_every="1h", steps_per_call=4, log_every=4)  # time: any K
