"""Files in each Jigsaw competition's own layout, built from the real comments of ../shared/data,
so the four competitions can be trained and evaluated here (the competitions' files are not).

`python -m parity_tests.competitions --out runs/competitions` writes:

  ub_train.csv, ub_valid.csv   Unintended Bias: id, comment_text, target (a fraction), the
                               sub-types the real labels give (severe_toxicity, obscene,
                               identity_attack, insult, threat), identity columns (a third of
                               the rows blank)
  ml_validation.csv            Multilingual validation.csv: id, comment_text, lang, toxic
  ml_test.csv                  Multilingual test.csv: id, content, lang
  tc_train.csv                 Toxic Comment train.csv (the real file's columns)
  tc_test_labelled.csv         Toxic Comment test rows with their labels
  rs_validation_data.csv       Rate Severity pairs (less_toxic, more_toxic) of tc_test's rows
  rules_train.csv              Agile Community Rules train.csv (row_id, body, rule, subreddit,
                               the four examples, rule_violation): two rules
  rules_test.csv               its test.csv (no rule_violation): all six rules
  rules_test_labelled.csv      the same rows with rule_violation (the solution)

Each file takes its own rows of the real file (`LAYOUT` says which), so no comment is in both a
training file and the file it is judged on. The fractions, identities and languages are drawn
from a seeded generator: only the comments and their `toxic` labels are real, so the numbers a
run gets here show the pipeline at work, not a competition score.

The rules files turn the six Toxic Comment labels into six subreddit rules (`RULES`, in our
own words): a row asks whether its comment breaks one rule, labelled by that rule's label, with
two comments that break the rule and two that do not, of the same file but never one of its
rows' comments, as its examples. The
training file holds two rules (`TRAIN_RULES`), the test file all six, as the competition's did;
the two files take disjoint comments. The subreddits are drawn and mean nothing.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from jaxtpu.core.data import pairing, readers

REAL_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "jigsaw_toxic_dev.csv"
IDENTITIES = ("male", "female", "muslim")
# The Unintended Bias sub-type columns, from the real file's Toxic Comment labels (its
# `sexual_explicit` has no counterpart there and is not written).
SUBTYPES = {
    "severe_toxicity": "severe_toxic",
    "obscene": "obscene",
    "identity_attack": "identity_hate",
    "insult": "insult",
    "threat": "threat",
}


def real_rows(real_csv: Path, n: int, start: int = 0) -> list[dict[str, str]]:
    with open(real_csv, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))[start : start + n]


def write_bias_file(real_csv: Path, path: Path, n: int, start: int, seed: int) -> Path:
    """An Unintended Bias train.csv layout: id, comment_text, target (a fraction kept on the
    comment's side of 0.5), the sub-type columns of `SUBTYPES` (the real labels), identity
    columns with about a third of the rows blank."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "target", *SUBTYPES, *IDENTITIES])
        for i, r in enumerate(real_rows(real_csv, n, start)):
            toxic = float(r["toxic"]) >= 0.5
            target = rng.choice([0.5, 0.7, 0.9, 1.0]) if toxic else rng.choice([0.0, 0.1, 0.3])
            who = [""] * len(IDENTITIES) if rng.random() < 0.3 else rng.choice([0, 0.2, 0.6, 1], 3)
            kinds = [r[label].strip() for label in SUBTYPES.values()]  # blank stays blank
            w.writerow([f"b{i}", r["comment_text"], target, *kinds, *who])
    return path


def write_language_file(
    real_csv: Path, path: Path, n: int, start: int, seed: int, labelled: bool = True
) -> Path:
    """The Multilingual validation.csv (id, comment_text, lang, toxic), or its test.csv
    (id, content, lang) when not `labelled`."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(
            ["id", "comment_text", "lang", "toxic"] if labelled else ["id", "content", "lang"]
        )
        for i, r in enumerate(real_rows(real_csv, n, start)):
            lang = rng.choice(["es", "it", "tr"])
            w.writerow([i, r["comment_text"], lang, r["toxic"]][: 4 if labelled else 3])
    return path


def write_real_rows(real_csv: Path, path: Path, n: int, start: int) -> Path:
    """Rows of the real file as they are (the Toxic Comment layout)."""
    rows = real_rows(real_csv, n, start)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_pairs_file(comments_csv: Path, path: Path, n_pairs: int, seed: int) -> Path:
    """A Rate Severity validation_data.csv: pairs of the file's comments whose severities
    (toxic + sub-labels) differ, ordered less -> more."""
    pairs = pairing.pairs_from_labels(readers.read_comments(comments_csv), n_pairs, seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["worker", "less_toxic", "more_toxic"])
        w.writerows((0, a, b) for a, b in zip(pairs.less, pairs.more, strict=True))
    return path


# The six Toxic Comment labels as subreddit rules, in our own words.
RULES = {
    "toxic": "No rude, disrespectful or unreasonable comments that make people leave a discussion.",
    "severe_toxic": "No extremely hateful or aggressive comments.",
    "obscene": "No obscene or vulgar language: no swearing and no sexual terms.",
    "threat": "No threats of violence or harm against anyone.",
    "insult": "No insults, name-calling or personal attacks on other users.",
    "identity_hate": "No hate aimed at a group: race, religion, gender, sexuality or disability.",
}
TRAIN_RULES = ("obscene", "insult")
SUBREDDITS = ("r/AskHistorians", "r/movies", "r/cooking", "r/science", "r/gaming", "r/news")
RULE_HEADER = [
    "row_id",
    "body",
    "rule",
    "subreddit",
    "positive_example_1",
    "positive_example_2",
    "negative_example_1",
    "negative_example_2",
    "rule_violation",
]


def _rule_rows(
    rows: list[dict[str, str]], labels: tuple[str, ...], per_class: int, rng, start: int
) -> list[list]:
    """Rows of the rules layout for each of `labels`' rules: up to `per_class` comments that
    break it and as many that do not, each with two of each as examples. The bodies come from
    the first 70% of `rows` and the examples from the rest, so no row's comment is an example
    anywhere in the file (an example's label would give the row's away)."""
    cut = len(rows) * 7 // 10
    out = []
    for label in labels:
        pos, neg = _by_label(rows[:cut], label)
        ex_pos, ex_neg = _by_label(rows[cut:], label)
        k = min(per_class, len(pos))
        bodies = [(pos[i], 1) for i in rng.choice(len(pos), k, replace=False)]
        bodies += [(neg[i], 0) for i in rng.choice(len(neg), k, replace=False)]
        for body, y in bodies:
            p_ex = [ex_pos[j] for j in rng.choice(len(ex_pos), 2, replace=False)]
            n_ex = [ex_neg[j] for j in rng.choice(len(ex_neg), 2, replace=False)]
            sub = SUBREDDITS[rng.integers(len(SUBREDDITS))]
            out.append([0, body, RULES[label], sub, *p_ex, *n_ex, y])
    order = rng.permutation(len(out))
    return [[start + i, *out[j][1:]] for i, j in enumerate(order)]


def _by_label(rows: list[dict[str, str]], label: str) -> tuple[list[str], list[str]]:
    """The comments of `rows` that have `label`, and those that do not."""
    pos = [r["comment_text"] for r in rows if float(r[label]) >= 0.5]
    return pos, [r["comment_text"] for r in rows if float(r[label]) < 0.5]


def write_rules_files(real_csv: Path, out: Path, seed: int = 0) -> list[Path]:
    """rules_train.csv (TRAIN_RULES, the first half of the real file's fully labelled
    comments), rules_test.csv and rules_test_labelled.csv (all six rules, the second half)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(real_csv, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if all(r[label].strip() for label in RULES)]
    half = len(rows) // 2
    train = _rule_rows(rows[:half], TRAIN_RULES, 300, rng, 0)
    test = _rule_rows(rows[half:], tuple(RULES), 150, rng, len(train))
    paths = [out / "rules_train.csv", out / "rules_test.csv", out / "rules_test_labelled.csv"]
    for path, table, labelled in zip(paths, (train, test, test), (True, False, True), strict=True):
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(RULE_HEADER if labelled else RULE_HEADER[:-1])
            w.writerows(r if labelled else r[:-1] for r in table)
    return paths


def build(real_csv: Path, out: Path) -> list[Path]:
    """Every competition's files in `out` (the rows of the real file each takes are fixed)."""
    out.mkdir(parents=True, exist_ok=True)
    tc_test = write_real_rows(real_csv, out / "tc_test_labelled.csv", 1000, 6000)
    return [
        write_bias_file(real_csv, out / "ub_train.csv", 3000, 0, 0),
        write_bias_file(real_csv, out / "ub_valid.csv", 1000, 3000, 1),
        write_language_file(real_csv, out / "ml_validation.csv", 1000, 4000, 2),
        write_language_file(real_csv, out / "ml_test.csv", 500, 5000, 3, labelled=False),
        write_real_rows(real_csv, out / "tc_train.csv", 3000, 0),
        tc_test,
        write_pairs_file(tc_test, out / "rs_validation_data.csv", 1000, 0),
        *write_rules_files(real_csv, out),
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write the files into")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments (default: %(default)s)")
    args = p.parse_args(argv)
    real = Path(args.csv)
    if not real.exists():
        p.error(f"--csv {real}: not found (see ../shared/data/SOURCES.md)")
    for path in build(real, Path(args.out)):
        print(path)


if __name__ == "__main__":
    main()
