"""A model's outputs as Perspective API's attributes (framework-free).

Every Jigsaw competition's label columns are Perspective's attributes under other names: Toxic
Comment's `toxic, severe_toxic, obscene, threat, insult, identity_hate` and Unintended Bias's
`toxicity` (`target`), `severe_toxicity, obscene, identity_attack, insult, threat,
sexual_explicit`. `attribute_map` names a run's score columns so; `--attributes` renames them,
or, for a rules model, defines each attribute as a rule's text that every comment is scored
against (a community's own rules, which Perspective never offered).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jaxtpu.core.errors import ConfigError

# Perspective's production attributes, by the Jigsaw label columns that carry them.
DEFAULT_ATTRIBUTES: dict[str, str] = {
    "toxic": "TOXICITY",
    "toxicity": "TOXICITY",
    "target": "TOXICITY",
    "severe_toxic": "SEVERE_TOXICITY",
    "severe_toxicity": "SEVERE_TOXICITY",
    "obscene": "PROFANITY",
    "threat": "THREAT",
    "insult": "INSULT",
    "identity_hate": "IDENTITY_ATTACK",
    "identity_attack": "IDENTITY_ATTACK",
    "sexual_explicit": "SEXUALLY_EXPLICIT",
}
NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")  # Perspective's attribute names: TOXICITY, ...


@dataclass(frozen=True)
class Attribute:
    """One attribute a server answers: its Perspective name, the model output it reads (a
    score column of the model), and for a rules model the rule's text it scores the comment
    against (empty otherwise)."""

    name: str
    column: str
    rule: str = ""

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "column": self.column,
            **({"rule": self.rule} if self.rule else {}),
        }


def parse_attributes(text: str) -> list[tuple[str, str]]:
    """`--attributes`: comma-separated `LEFT=RIGHT` items, as (LEFT, RIGHT). For a model of
    label columns, `column=NAME` (e.g. `toxic=TOXICITY,obscene=PROFANITY`); for a rules model
    `NAME=rule text` (e.g. `NO_ADVERTISING="No advertising: ..."`). A value may be quoted with
    double quotes to hold commas.

    Raises:
      ConfigError: an item without '=', an empty side, or an unbalanced quote.
    """
    items, buf, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            items.append("".join(buf))
            buf = []
            continue
        buf.append(ch)
    if quoted:
        raise ConfigError(f"--attributes {text!r}: a double quote is not closed")
    items.append("".join(buf))
    out = []
    for item in items:
        left, eq, right = item.partition("=")
        left, right = left.strip(), right.strip()
        if len(right) >= 2 and right[0] == right[-1] == '"':
            right = right[1:-1]
        if not eq or not left or not right:
            raise ConfigError(
                f"--attributes: {item.strip()!r} is not LEFT=RIGHT (column=NAME, or for a rules "
                'model NAME="rule text"), items separated by commas'
            )
        out.append((left, right))
    return out


def _check_name(name: str) -> str:
    if not NAME.match(name):
        raise ConfigError(
            f"--attributes: attribute name {name!r} must be upper-case letters, digits and _ "
            "(as Perspective's: TOXICITY, SEVERE_TOXICITY), starting with a letter"
        )
    return name


def attribute_map(
    columns: Sequence[str], rules_model: bool, given: str = ""
) -> tuple[Attribute, ...]:
    """The attributes a model answers.

    Args:
      columns: the model's score columns (its label columns, then auxiliary targets).
      rules_model: the model scores (rule, comment) pairs: every attribute is a rule.
      given: `--attributes` as written ('' = the Jigsaw columns' Perspective names).

    Raises:
      ConfigError: a rules model without `--attributes`; a column the model lacks; a name
        given twice; a model none of whose columns has a Perspective name.
    """
    if rules_model:
        if not given:
            raise ConfigError(
                "a rules model answers the rules you name: pass --attributes "
                'NAME="rule text",... (e.g. NO_ADVERTISING="No advertising: no spam, referral '
                'links or promotions")'
            )
        out = [Attribute(_check_name(n), columns[0], rule) for n, rule in parse_attributes(given)]
    elif given:
        out = []
        for column, name in parse_attributes(given):
            if column not in columns:
                raise ConfigError(
                    f"--attributes: the model has no column {column!r}; its columns: "
                    f"{', '.join(columns)}"
                )
            out.append(Attribute(_check_name(name), column))
    else:
        out = [Attribute(DEFAULT_ATTRIBUTES[c], c) for c in columns if c in DEFAULT_ATTRIBUTES]
        if not out:
            raise ConfigError(
                f"none of the model's columns ({', '.join(columns)}) is a Jigsaw label with a "
                "Perspective name: name them with --attributes column=NAME,..."
            )
    return _unique(out)


def _unique(attributes: list[Attribute]) -> tuple[Attribute, ...]:
    seen: dict[str, Attribute] = {}
    for a in attributes:
        if a.name in seen:
            raise ConfigError(f"--attributes: {a.name} is given twice")
        seen[a.name] = a
    return tuple(attributes)


def merge(maps: Sequence[Sequence[Attribute]], sources: Sequence[str]) -> dict[str, int]:
    """Which of several models (runs served side by side) answers each attribute: {name:
    index of the model}. An attribute two models answer is refused."""
    owner: dict[str, int] = {}
    for i, attrs in enumerate(maps):
        for a in attrs:
            if a.name in owner:
                raise ConfigError(
                    f"attribute {a.name} is answered by both {sources[owner[a.name]]} and "
                    f"{sources[i]}; rename one with --attributes"
                )
            owner[a.name] = i
    return owner


def as_records(attributes: Sequence[Attribute]) -> list[dict[str, str]]:
    """The map as JSON records (what a run, an export and the model card store)."""
    return [a.to_dict() for a in attributes]


def from_records(records: Sequence[Mapping[str, str]]) -> tuple[Attribute, ...]:
    """`as_records`' inverse."""
    return tuple(Attribute(r["name"], r["column"], r.get("rule", "")) for r in records)


def recorded_map(
    columns: Sequence[str], rules_model: bool, text: str
) -> list[dict[str, str]] | None:
    """What a run's export records as its map: the run's `--attributes` (`text`) or the
    default, of the exported `columns`; None where there is none to record (a rules run trained
    without --attributes, columns without Perspective names, a map naming columns the export
    left out)."""
    try:
        return as_records(attribute_map(columns, rules_model, text))
    except ConfigError:
        return None


def served_map(
    columns: Sequence[str],
    rules_model: bool,
    given: str,
    stored: str | Sequence[Mapping[str, str]] | None,
    source: str,
) -> tuple[Attribute, ...]:
    """The attributes a served model answers: serve's `--attributes` (`given`) when given;
    else what the model stored (a run's `--attributes` text, or an export's records); else
    the columns' Perspective names.

    Raises:
      ConfigError: as `attribute_map`; stored records naming a column the model lacks."""
    if given or not stored:
        return attribute_map(columns, rules_model, given)
    if isinstance(stored, str):
        return attribute_map(columns, rules_model, stored)
    out = from_records(stored)
    missing = [a.column for a in out if a.column not in columns]
    if missing:
        raise ConfigError(
            f"{source}: its recorded attributes read column(s) {', '.join(missing)}, which "
            f"the model does not have ({', '.join(columns)}); pass --attributes"
        )
    for a in out:
        _check_name(a.name)
    return _unique(list(out))
