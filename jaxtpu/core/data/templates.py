"""How a row's columns become the text the model reads beside its comment (framework-free):
`--rule-template` (the first text of a rules row's pair) and `--prompt-template` (the whole
row as one prompt, the comment's place marked), each checked against a file's header and
rendered from its rows' whitespace-normalised values."""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from typing import Any

from jaxtpu.core.data.prompts import COMMENT, Message
from jaxtpu.core.data.records import Comments
from jaxtpu.core.errors import DataError
from jaxtpu.core.textformat import PAIR, PROMPT, TextFormat

DEFAULT_RULE_TEMPLATE = "{rule}"  # --rule-template's default: the rule alone


def normalize_text(text: str) -> str:
    """Collapses all runs of whitespace (newlines, tabs) to one space."""
    return " ".join(text.split())


class _ColumnTemplate:
    """What `RuleTemplate` and `PromptTemplate` share: the columns of a rules file a template
    names (`fields`), checked against a file's header and read from its rows, each value
    whitespace-normalised; `flag` names the template in messages."""

    flag = ""

    @classmethod
    def _names(cls, template: str, text: str) -> list[str]:
        """The {...} names of `text` (the template as it is read), each one column."""
        try:
            return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        except ValueError as e:
            raise DataError(f"{cls.flag} {template!r}: {e}") from None

    @classmethod
    def _check_names(cls, template: str, fields: list[str], example: str) -> None:
        if any(not f.isidentifier() for f in fields):
            raise DataError(
                f"{cls.flag} {template!r}: each {{...}} names one column, e.g. {{{example}}}"
            )

    def __init__(self, template: str, text: str, fields: tuple[str, ...]) -> None:
        self.template, self.text, self.fields = template, text, fields

    def check(self, path: Any, header: list[str]) -> None:
        missing = [f for f in self.fields if f not in header]
        if missing:
            raise DataError(
                f"{path}: {self.flag} {self.template!r} names column(s) "
                f"{', '.join(missing)} the file does not have; found: {', '.join(header)}"
            )

    def _values(self, row: Mapping[str, Any]) -> dict[str, str]:
        return {f: normalize_text(row[f]) if isinstance(row[f], str) else "" for f in self.fields}


class RuleTemplate(_ColumnTemplate):
    """`--rule-template`: the first text of each rules row's pair, from its columns
    (`{rule}`, `{subreddit}`, `{positive_example_1}`, ...), each value whitespace-normalised.
    The rule itself must be in it: the model has to read which rule it is asked about."""

    flag = "--rule-template"
    form = PAIR  # its rows are text pairs (`TextFormat`)

    def __init__(self, template: str = DEFAULT_RULE_TEMPLATE) -> None:
        fields = self._names(template, template)
        if "rule" not in fields:
            raise DataError(
                f"--rule-template {template!r} has no {{rule}}: the model must read the rule"
            )
        self._check_names(template, fields, "subreddit")
        super().__init__(template, template, tuple(dict.fromkeys(fields)))

    def render(self, row: Mapping[str, Any]) -> str:
        return normalize_text(self.text.format_map(self._values(row)))


class PromptTemplate(_ColumnTemplate):
    """`--prompt-template`: each row as one prompt, the template's text as written (`\\n` and
    `\\t` in it are a newline and a tab) with `{comment}` where the comment goes and, in a
    rules file, `{rule}` and any other column (`{subreddit}`, `{positive_example_1}`, ...),
    each value whitespace-normalised. `render` gives the prompt around the comment, a
    `prompts.Message`: the first of the row's pair, the comment its second
    (`jaxtpu.core.data.prompts` tokenizes them)."""

    flag = "--prompt-template"
    form = PROMPT  # its rows are prompts (`TextFormat`)

    def __init__(self, template: str, rules: bool = True) -> None:
        text = template.replace("\\n", "\n").replace("\\t", "\t")
        fields = self._names(template, text)
        if fields.count(COMMENT) != 1:
            raise DataError(
                f"--prompt-template {template!r} names {{comment}} {fields.count(COMMENT)} "
                "times; once, where the comment goes (it is the part cut at --max-len)"
            )
        self._check_names(template, fields, "rule")
        columns = tuple(dict.fromkeys(f for f in fields if f != COMMENT))
        if rules and "rule" not in columns:
            raise DataError(
                f"--prompt-template {template!r} has no {{rule}}: the model must read the rule"
            )
        if not rules and columns:
            raise DataError(
                f"--prompt-template {template!r} names {', '.join(columns)}: a prompt of "
                "comments alone names only {comment} (the rules task reads a row's columns)"
            )
        super().__init__(template, text, columns)
        self._before, self._after = _halves(text)

    def render(self, row: Mapping[str, Any]) -> Message:
        values = self._values(row)
        return Message(self._before.format_map(values), self._after.format_map(values))


def _halves(text: str) -> tuple[str, str]:
    """The template `text` as two templates, of the text before `{comment}` and after it."""
    halves: tuple[list[str], list[str]] = ([], [])
    half = halves[0]
    for literal, name, spec, conversion in string.Formatter().parse(text):
        half.append(literal.replace("{", "{{").replace("}", "}}"))
        if name == COMMENT:
            half = halves[1]
        elif name is not None:
            half.append(f"{{{name}{'!' + conversion if conversion else ''}:{spec or ''}}}")
    return "".join(halves[0]), "".join(halves[1])


def template_of(fmt: TextFormat) -> RuleTemplate | PromptTemplate | None:
    """The template a run's rows are rendered with (`TextFormat`): a rules row's first text
    (`--rule-template`), each row's prompt (`--prompt-template`), or None (a comment alone)."""
    if fmt.kind == PAIR:
        return RuleTemplate(fmt.template)
    if fmt.kind == PROMPT:
        return PromptTemplate(fmt.template, fmt.rules)
    return None


def prompted(data: Comments, fmt: TextFormat) -> Comments:
    """`data` (comments, not a rules file's rows) as prompts when the run reads prompts
    (`--prompt-template`, naming only `{comment}`): the same prompt around every comment."""
    if fmt.kind != PROMPT:
        return data
    first = PromptTemplate(fmt.template, rules=False).render({})
    return dataclasses.replace(data, first=[first] * len(data), digests=None, form=PROMPT)
