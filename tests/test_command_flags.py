"""The other commands' flags (`jaxtpu.core.flags.commands`): each command's `--help` and the
docs' reference come from one schema, and numeric values are checked against its bounds."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags import commands
from jaxtpu.core.flags.commands import COMMANDS, check_command_flags, command_parser


@pytest.mark.parametrize("name", COMMANDS)
def test_every_field_is_a_flag_of_the_command_and_a_row_of_the_reference(name):
    parser = command_parser(name, "test")
    flags = {a for action in parser._actions for a in action.option_strings}
    section = commands.command_reference().split(f"## {name}\n")[1].split("\n## ")[0]
    fields = [f.name for f in dataclasses.fields(COMMANDS[name].flags)]
    for field_name in [*fields, *COMMANDS[name].scoring]:
        flag = "--" + field_name.replace("_", "-")
        assert flag in flags, (name, flag)
        assert f"| `{flag}` |" in section, (name, flag)


def test_the_parsers_keep_what_the_commands_had():
    predict = command_parser("predict", "test")
    args = predict.parse_args(["--workdir", "a", "b", "--input", "x.csv", "--output", "o.csv"])
    assert args.workdir == ["a", "b"] and args.max_len is None and args.chunk_rows == 32768
    with pytest.raises(SystemExit):  # one source or the other
        predict.parse_args(
            ["--workdir", "a", "--init-from", "m.bin", "--input", "x", "--output", "o"]
        )
    evaluate = command_parser("evaluate", "test")
    with pytest.raises(SystemExit):  # a run or a model directory is required
        evaluate.parse_args(["--input", "x.csv"])
    assert evaluate.parse_args(["--model-dir", "m", "--input", "x"]).workdir is None
    export = command_parser("export", "test")
    with pytest.raises(SystemExit):
        export.parse_args(["--workdir", "w", "--out", "o", "--format", "tflite"])
    assert export.parse_args(["--workdir", "w", "--out", "o"]).format == "hf"
    preflight = argparse.ArgumentParser()
    commands.add_command_flags(preflight, "preflight", choices={"target": ("cpu", "v5e-8")})
    assert preflight.parse_args(["--sweep"]).sweep == "all"
    assert preflight.parse_args([]).target == "cpu"


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        (
            "launch",
            ["--tpu", "t", "--zone", "z", "--accelerator-type", "v4-8", "--retries", "-1"],
            "--retries must be >= 0, got -1",
        ),
        (
            "severity-weights",
            ["--workdir", "w", "--input", "p.csv", "--step", "0"],
            "--step must be > 0, got 0.0",
        ),
        ("lr-find", ["--lr-find-steps", "2"], "--lr-find-steps must be >= 5, got 2"),
        (
            "predict",
            ["--workdir", "w", "--input", "i", "--output", "o", "--batch-size", "0"],
            "--batch-size must be >= 1, got 0",
        ),
    ],
)
def test_a_value_outside_its_bounds_is_one_line(name, argv, message):
    args = command_parser(name, "test").parse_args(argv)
    with pytest.raises(ConfigError) as e:
        check_command_flags(name, args)
    assert str(e.value) == message
