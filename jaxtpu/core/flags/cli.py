"""The command line of both trainers: one flag per config field, a preset first, and each
side's own strategies (framework-free).

Unknown flags are an error that lists the valid ones; `--help` explains every flag, with its
choices and the demo preset's value.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, get_type_hints

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.configfile import read_config_file
from jaxtpu.core.flags.fromrun import inherit
from jaxtpu.core.flags.presets import NEEDS_MODEL_DIR, PRESETS, check_needs, get_preset
from jaxtpu.core.flags.schema import (
    FIELDS,
    JAX_ONLY,
    JAX_STRATEGIES,
    RESUME_MAY_CHANGE,
    SECTIONS,
    TORCH_STRATEGIES,
    Config,
    ScoringConfig,
    apply_overrides,
    base_type,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default hides the valid flags
        if "unrecognized arguments" in message:
            flags = sorted(a for act in self._actions for a in act.option_strings if "--" in a)
            message += "\nvalid flags: " + " ".join(flags)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(prog: str, description: str, strategies: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of one trainer; `strategies` are the `--parallel` values this side runs, the
    first being its default."""
    parser = _Parser(prog=prog, description=description)
    defaults = {k: getattr(getattr(Config(), s), k) for k, (s, _) in FIELDS.items()}
    defaults["parallel"] = strategies[0]
    parser.add_argument(
        "--preset",
        default="demo",
        choices=list(PRESETS),
        help="Starting configuration; the flags below override it. "
        + " ".join(f"{k}: {(v.__doc__ or '').splitlines()[0]}" for k, v in PRESETS.items()),
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="A YAML or JSON file of flag values (flag names as keys, flat or under the "
        f"sections {'/'.join(SECTIONS)}), applied over the preset; flags given here override "
        "it. A run directory's "
        "config.json reruns that run (its workdir and resume are left out).",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="Print the configuration these flags resolve to (preset, --config file, flags) as "
        "YAML and exit: a config file to keep, edit and pass back with --config (LightningCLI's "
        "--print_config). `--preset xla-notebook --print-config` is that preset as a file.",
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(section)
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            choices = f.metadata.get("choices")
            help_text = f.metadata["help"]
            if f.name == "parallel":
                choices = tuple(strategies)
                help_text = STRATEGY_HELP.get(choices, help_text)
            one_of = f" One of: {', '.join(choices)}." if choices else ""
            help_text = f"{help_text}{one_of} [default: {defaults[f.name]}]"
            kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text}
            typ = base_type(hints[f.name])
            if typ is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = typ
                kwargs["metavar"] = f.name.upper()
                if choices:
                    kwargs["choices"] = list(choices)
            group.add_argument(flag, **kwargs)
    return parser


STRATEGY_HELP = {
    JAX_STRATEGIES: "Data-parallel strategy: jit (pjit: one global step, NamedSharding over a "
    "('data', 'fsdp') mesh shaped by --mesh, state placed as --sharding says), pmap (replicated "
    "state, per-device step with lax.pmean; in maintenance mode in JAX), or shard_map (pmap's "
    "per-device step under jax.shard_map on the jit mesh; what pmap-era code migrates to).",
    TORCH_STRATEGIES: "Data-parallel strategy: spmd (one process, xr.use_spmd, inputs sharded "
    "on a mesh), spawn (xmp.spawn, one replica per device), eager (plain PyTorch, no XLA, 1 "
    "device: the first CUDA GPU, else the host CPU), or ddp (plain PyTorch, one process per "
    "device with DistributedDataParallel: one per CUDA GPU over NCCL, or CPU processes over "
    "gloo).",
}


def parse_args(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    strategies: Sequence[str] = JAX_STRATEGIES,
) -> Config:
    """Parses flags into a Config: preset first, then every flag given explicitly.

    Args:
      argv: the flags (default: sys.argv[1:]).
      prog, description: for --help.
      strategies: the `--parallel` values of this side; the first is its default.
    """
    return parse_with(argv, prog, description, strategies)[0]


def parse_with(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    strategies: Sequence[str] = JAX_STRATEGIES,
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[Config, argparse.Namespace]:
    """`parse_args` for a command with flags of its own besides the training flags
    (`add_flags` adds them): the Config and the parsed namespace."""
    parser = build_parser(prog, description, strategies)
    if add_flags:
        add_flags(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    cfg = get_preset(args.preset)
    overrides = {
        k: v for k, v in vars(args).items() if k != "preset" and v is not None and k in FIELDS
    }
    try:
        if args.config:  # the file first; the command line's flags over it
            overrides = {**read_config_file(args.config), **overrides}
        args.given = frozenset(overrides)  # what the user chose, for `implied`
        overrides = inherit(overrides, cfg)  # --init-from RUN: RUN's model flags beneath
        if cfg.placement.parallel not in strategies:
            overrides.setdefault("parallel", strategies[0])
        cfg = apply_overrides(cfg, overrides)
        if args.print_config:
            if args.preset in NEEDS_MODEL_DIR and not cfg.model.model_dir:  # never a silent
                cfg = cfg.replace(model_dir=MODEL_DIR_PLACEHOLDER)  # random init from the file
            print(config_yaml(cfg, f"{prog} --preset {args.preset}"), end="")
            sys.exit(0)
        check_needs(args.preset, cfg)
        return cfg, args
    except ConfigError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def implied(cfg: Config, given: frozenset[str], choices: dict[str, Any], why: str) -> Config:
    """`cfg` with each of `choices` (flag name -> value) applied where the user gave no value
    for that flag (on the command line or in --config), saying so in one line on stderr
    ("--target t4x2 implies --precision fp16 --num-devices 2: ..."); a flag the user gave is
    left as it is, for the command's own check to accept or refuse. Nothing is said when
    nothing changes."""
    chosen = {
        k: v
        for k, v in choices.items()
        if k not in given and getattr(getattr(cfg, FIELDS[k][0]), k) != v
    }
    if not chosen:
        return cfg
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in chosen.items())
    print(f"{why}: using {flags} (give them to choose otherwise)", file=sys.stderr, flush=True)
    return apply_overrides(cfg, chosen)


# What --print-config writes for a preset's required model directory: a run from the file
# stops at it (no such directory) instead of training a random model.
MODEL_DIR_PLACEHOLDER = "SET-ME: the pretrained model directory"


def config_yaml(cfg: Any, source: str) -> str:
    """`cfg` as a YAML config file (sections of flag names), headed by where it came from."""
    import yaml

    body = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
    return f"# jaxtpu config, from: {source}\n# use: jaxtpu train --config THIS_FILE\n{body}"


def flag_reference() -> str:
    """Every training flag as Markdown, from the schema: one table per config section with
    the help text, the accepted values, the default (`Config()`, the demo preset), whether it
    is jaxtpu only and whether it may change on --resume (the docs' flag reference page)."""
    defaults = {k: getattr(getattr(Config(), s), k) for k, (s, _) in FIELDS.items()}
    out = []
    for section, cls in SECTIONS.items():
        out += [f"## {section}", "", "| flag | what it does | default |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            notes = []
            if f.metadata.get("choices"):
                notes.append("one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"] if c))
            bounds = f.metadata.get("bounds")
            if bounds is not None:
                notes.append("accepts " + _bounds_text(bounds))
            if f.metadata["side"] == "jax":
                notes.append("*jaxtpu only*")
            if f.metadata["resume"]:
                notes.append("*may change on --resume*")
            text = f.metadata["help"].replace("|", "\\|")
            if notes:
                text += " (" + "; ".join(notes) + ")"
            default = defaults[f.name]
            shown = "" if default in (None, "") else f"`{default}`"
            out.append(f"| `--{f.name.replace('_', '-')}` | {text} | {shown} |")
        out.append("")
    return "\n".join(out)


def add_scoring_flags(
    parser: argparse.ArgumentParser, names: Sequence[str], unset: Sequence[str] = ()
) -> None:
    """Adds the scoring flags `names` (fields of `schema.ScoringConfig`) with their help and
    default; those in `unset` default to None (the command applies the default when it uses
    the flag, and can tell that it was not given)."""
    fields = {f.name: f for f in dataclasses.fields(ScoringConfig)}
    hints = get_type_hints(ScoringConfig)
    for name in names:
        f = fields[name]
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=base_type(hints[name]),
            metavar=name.upper(),
            default=None if name in unset else f.default,
            help=f"{f.metadata['help']} [default: {f.default}]",
        )


def check_scoring_flags(args: argparse.Namespace) -> None:
    """The scoring flags given, bounds-checked as the training flags are (ConfigError)."""
    for f in dataclasses.fields(ScoringConfig):
        value = getattr(args, f.name, None)
        problem = None if value is None else f.metadata["bounds"].problem(value)
        if problem:
            raise ConfigError(f"--{f.name.replace('_', '-')} must be {problem}, got {value}")


def flag_list(kind: str) -> str:
    """The flags of a schema table as docs prose (`--a`, `--b` and `--c`): 'resume' (those
    that may change on --resume, `RESUME_MAY_CHANGE`) or 'jax-only' (`JAX_ONLY`)."""
    names = {"resume": RESUME_MAY_CHANGE - {"resume"}, "jax-only": set(JAX_ONLY)}[kind]
    flags = [f"`--{n.replace('_', '-')}`" for n in FIELDS if n in names]
    return ", ".join(flags[:-1]) + f" and {flags[-1]}"


def _bounds_text(bounds: Any) -> str:
    """The values a numeric flag accepts, as `Bounds.problem` words them."""
    probe = bounds.problem(float("nan"))  # "a finite number in [..]" (+ " or <special>")
    return (probe or "").removeprefix("a finite number ").strip() or "any finite number"
