"""The kinds of input file, one table (framework-free): which columns make each, how messages
describe it, and what scoring it means (its output's id column, whether it is a Rate Severity
file scored one number per comment, whether its rows may become pseudo-labels or be ranked
within their rule). A `Task` names the kinds it trains on (`reads`), is evaluated on
(`evaluated_on`) and scores (`predicts`); readers, evaluate and predict's checks read this
table and these names, not the columns.

A new file kind is a row here, its reader in `readers.READERS` and its name in the tasks that
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtpu.core.data.records import PAIRS_COLUMNS, RULES_COLUMNS, SCORE_COLUMNS, TEXT_COLUMNS
from jaxtpu.core.tasks import LABEL_COLUMNS


@dataclass(frozen=True)
class FileKind:
    """One kind of input file.

    Attributes:
      name: how tasks and the code name it.
      columns: the columns it has, every one.
      one_of: groups of columns of which it has at least one each (a comment's text column).
      what: how messages describe a file of this kind.
      expected: the columns a message asks for when a file is not of this kind.
      labelled: it holds labels (evaluate scores it against them).
      id_column: the id column of the file predict writes for it (Kaggle's submission's).
      severity: a Rate Severity file: scored one number per comment (`comment_id,score`).
      pseudo_labels: its scored rows may be written as training targets (--pseudo-label);
        else `instead` says what to do instead.
      by_rule: its rows ask about a rule, so scores may be ranked within it (--rank-by-rule).
    """

    name: str
    columns: tuple[str, ...]
    what: str
    expected: str
    one_of: tuple[tuple[str, ...], ...] = ()
    labelled: bool = False
    id_column: str = "id"
    severity: bool = False
    pseudo_labels: bool = True
    by_rule: bool = False
    instead: str = ""

    def matches(self, header: list[str]) -> bool:
        cols = set(header)
        return set(self.columns) <= cols and all(cols & set(g) for g in self.one_of)


# In the order a header is matched against them: the first kind whose columns it has.
FILE_KINDS: tuple[FileKind, ...] = (
    FileKind(
        "rules",
        RULES_COLUMNS,
        "an Agile Community Rules file (body, rule)",
        "body, rule, rule_violation (Agile Community Rules)",
        labelled=True,  # its test file has no rule_violation: readers check the column
        id_column="row_id",
        pseudo_labels=False,
        by_rule=True,
        instead="train on its examples with --rule-examples",
    ),
    FileKind(
        "pairs",
        PAIRS_COLUMNS,
        "a pairs file (less_toxic, more_toxic)",
        "less_toxic, more_toxic (pairs)",
        labelled=True,
    ),
    FileKind(
        "classification",
        (),
        "labelled comments (comment_text or content, with toxic or target)",
        "comment_text, toxic or target (labels)",
        one_of=(TEXT_COLUMNS, LABEL_COLUMNS),
        labelled=True,
    ),
    FileKind(
        "score",
        SCORE_COLUMNS,
        "a Rate Severity file of comments to score (comment_id, text)",
        "comment_id, text (comments to score)",
        id_column="comment_id",
        severity=True,
    ),
    FileKind(
        "unlabelled",
        (),
        "comments to score (comment_text or content, no labels)",
        "comment_text or content (comments to score)",
        one_of=(TEXT_COLUMNS,),
    ),
)
BY_NAME = {k.name: k for k in FILE_KINDS}


def kind_of(header: list[str]) -> FileKind | None:
    """The kind of a file with columns `header`, or None (no comment column at all)."""
    return next((k for k in FILE_KINDS if k.matches(header)), None)


def described(names: tuple[str, ...]) -> str:
    """The kinds `names`, as a message lists them ('a pairs file (...) or labelled ...')."""
    return " or ".join(BY_NAME[n].what for n in names)
