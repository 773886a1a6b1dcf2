"""`--config FILE`: a YAML or JSON file of flag values, under the flag names (`lr: 3.0e-5`,
`batch-size` or `batch_size`), flat or in the config's sections (`optim: {lr: ...}`), or a run
directory's `config.json`, which holds them under `config` (framework-free).

Precedence: the preset, then the file, then every flag given on the command line. A run's
`config.json` read back reproduces that run, except where it lives: its `workdir` and
`resume` are left out (give `--workdir` for the new run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_type_hints

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.schema import FIELDS, FORMER_SECTIONS, SECTIONS, _check_type

# Where and how a recorded run ran, not what it computed: not taken from a run's config.json.
PLACE_KEYS = ("workdir", "resume")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The flat `{field: value}` overrides of a config file, every key known and every value
    of its field's type, or a ConfigError naming the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {p}: no such file")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml  # PyYAML: the one YAML reader the ecosystem's configs are written for

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except (ValueError, ImportError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"--config {p}: not readable as {p.suffix or 'JSON'} ({first})") from None
    except Exception as e:  # yaml.YAMLError and its kinds
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"--config {p}: not valid YAML ({first})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {p}: expected a mapping of flag names to values")
    record = "config" in raw and isinstance(raw["config"], dict)
    if record:  # a run directory's config.json
        raw = raw["config"]
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if (key in SECTIONS or key in FORMER_SECTIONS) and isinstance(value, dict):
            for inner, v in value.items():
                _put(p, flat, str(inner), v)
        else:
            _put(p, flat, str(key), value)
    if record:
        for key in PLACE_KEYS:
            flat.pop(key, None)
    return flat


def _put(path: Path, flat: dict[str, Any], key: str, value: Any) -> None:
    """One key of the file, checked as the command line checks a flag (a YAML `1e-4`, which
    YAML reads as text, is the number it spells)."""
    name = key.replace("-", "_")
    if name not in FIELDS:
        raise ConfigError(
            f"--config {path}: unknown key {key!r}; the keys are the training flags' names "
            "(see --help)"
        )
    section, _ = FIELDS[name]
    try:
        flat[name] = _check_type(name, value, get_type_hints(SECTIONS[section])[name])
    except ConfigError as e:
        raise ConfigError(f"--config {path}: {e}") from None
