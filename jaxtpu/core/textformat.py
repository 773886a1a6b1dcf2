"""How a row becomes the text the tokenizer reads, one record (framework-free): a comment
alone, a text pair (the rules task: its `--rule-template` over the row's columns, then the
comment), or a prompt (`--prompt-template`: the row inside instructions, laid out by the
tokenizer's chat template when it has one).

It is resolved once from the flags (`TextFormat.of`), recorded in a run's `config.json`
(`RunSpec.text_format`) and in its exports, and read by everything that turns rows or texts
into tokens: training, evaluate, predict, the Python API, export, the ensemble check and the
server. Tokenizing asks it which form the items are (`jaxtpu.core.data.tokens.FORMS`); no item
is looked at to find out. A new form is a new kind here and its row there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMMENT, PAIR, PROMPT = "comment", "pair", "prompt"
KINDS = (COMMENT, PAIR, PROMPT)


@dataclass(frozen=True)
class TextFormat:
    """How a row becomes text.

    Attributes:
      kind: COMMENT (the comment alone), PAIR (first text, then the comment, as the tokenizer
        encodes pairs: the comment is truncated, never the first) or PROMPT (one text: the
        instructions around the comment, the comment cut at --max-len, never the rest).
      template: PAIR: `--rule-template`; PROMPT: `--prompt-template`, as the flag gives it.
      rules: the rows are a rules file's (the template reads their columns); else comments
        alone (a prompt then names only `{comment}`).
    """

    kind: str = COMMENT
    template: str = ""
    rules: bool = False

    @classmethod
    def of(cls, data: Any, task: Any) -> TextFormat:
        """The format a run's flags ask for (`data`: its `DataConfig`, `task`: its `Task`)."""
        if data.prompt_template:
            return cls(PROMPT, data.prompt_template, task.text_pairs)
        if task.text_pairs:
            return cls(PAIR, data.rule_template, True)
        return cls()

    @property
    def collapses_whitespace(self) -> bool:
        """Whether the comment's whitespace is collapsed before tokenizing, as jaxtpu reads
        every comment, and an export's tokenizer must do so too: not for a prompt, whose
        newlines (its own and the chat template's) the model read as they are."""
        return self.kind != PROMPT

    @property
    def flag(self) -> str:
        """The flag that set it ('' for a comment alone)."""
        return {PAIR: "--rule-template", PROMPT: "--prompt-template"}.get(self.kind, "")

    def describe(self) -> str:
        """How messages name it: "--prompt-template 'Rule: {rule} ...'" or 'each comment
        alone'."""
        return f"{self.flag} {self.template!r}" if self.flag else "each comment alone"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "template": self.template, "rules": self.rules}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextFormat:
        if d.get("kind") not in KINDS:
            raise ValueError(f"text format {d.get('kind')!r}: not one of {', '.join(KINDS)}")
        return cls(d["kind"], d.get("template", ""), bool(d.get("rules", False)))


PLAIN = TextFormat()  # each comment alone: the classification and ranking tasks' default
