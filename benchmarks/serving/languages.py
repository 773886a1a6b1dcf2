"""What the language detector does to real English comments, the data behind `jaxtpu serve`'s
rule that a detection never refuses a comment (`jaxtpu.core.serving.languages`).

`python -m benchmarks.serving.languages [--report docs/measured/languages.json]`

For each file of real comments in `../shared/data` (all English, read its SOURCES.md): how many
comments the detector is sure (probability >= 0.8, three words or more) are in another
language, which a rule that refuses sure detections (Perspective's, and jaxtpu's before issue
95) would have answered with a 400, and how many of those are toxic (the file's label, or
Perspective's TOXICITY, at 0.5 or above). Then the same for the toxic comments with a short
foreign tail appended (a French, a German and a Spanish sentence): what anyone can do to a
slur to make a refusing rule let it through unscored.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from benchmarks.shared.machine import cpu_record
from benchmarks.shared.measured import show_and_keep
from benchmarks.shared.measured import start as start_report

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
FILES = {  # file -> the column that says it is toxic (>= 0.5)
    "jigsaw_toxic_dev.csv": "toxic",
    "perspective_scored_wikipedia.csv": "TOXICITY",
    "perspective_scored_rtp.csv": "TOXICITY",
}
TAILS = {
    "fr": "Tu es vraiment un idiot, va-t'en.",
    "de": "Das ist wirklich nicht gut so.",
    "es": "Eso no es verdad, amigo mío.",
}
EXAMPLES = 5


def _toxic(row: dict[str, str], column: str) -> bool:
    try:
        return float(row[column] or 0) >= 0.5
    except ValueError:
        return False


def measure(data: Path) -> dict[str, Any]:
    """The detector's sure detections of another language than English, per file and with
    each foreign tail."""
    from jaxtpu.core.serving.languages import Detector

    csv.field_size_limit(1 << 30)
    detector = Detector()
    files, tails = [], {lang: [0, 0] for lang in TAILS}  # tail -> [toxic comments, refused]
    for name, column in FILES.items():
        with open(data / name, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        refused, toxic, examples = 0, 0, []
        for row in rows:
            text, is_toxic = row["comment_text"], _toxic(row, column)
            d = detector.detect(text)
            if d.sure and d.top != "en":
                refused += 1
                toxic += is_toxic
                if is_toxic and len(examples) < EXAMPLES:
                    examples.append([" ".join(text.split())[:60], d.top, d.probabilities[0]])
            if is_toxic:
                for lang, tail in TAILS.items():
                    t = detector.detect(f"{text} {tail}")
                    tails[lang][0] += 1
                    tails[lang][1] += t.sure and t.top != "en"
        files.append(
            {
                "file": name,
                "comments": len(rows),
                "refused": refused,
                "toxic_refused": toxic,
                "toxic_examples": examples,
            }  # fmt: skip
        )
    return {
        "files": files,
        "tails": {
            lang: {"toxic": n, "refused": r, "tail": TAILS[lang]} for lang, (n, r) in tails.items()
        },  # fmt: skip
        "cpu": cpu_record(),
    }


def table(report: dict[str, Any]) -> str:
    """The report as Markdown: a row per file, then a row per foreign tail."""
    lines = [
        "| real English comments | comments | sure of another language (a refusing rule's 400s) "
        "| of them toxic | toxic examples (detected as) |",
        "|---|---|---|---|---|",
    ]
    for f in report["files"]:
        shown = "; ".join(f"{t!r} ({lang} {p:.2f})" for t, lang, p in f["toxic_examples"])
        lines.append(
            f"| {f['file']} | {f['comments']:,} | {f['refused']} | {f['toxic_refused']} | "
            f"{shown or '-'} |"
        )
    lines += [
        "",
        "| the toxic comments above, with a tail appended | toxic comments | sure of another "
        "language | share |",
        "|---|---|---|---|",
    ]
    for lang, t in report["tails"].items():
        share = t["refused"] / t["toxic"] if t["toxic"] else 0.0
        lines.append(f"| {lang}: {t['tail']!r} | {t['toxic']:,} | {t['refused']:,} | {share:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.languages", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--data", default=str(DATA), help="the folder of the shared real comments")
    p.add_argument(
        "--report",
        help="also keep the result as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/languages.json",
    )
    args = p.parse_args(argv)
    missing = [n for n in FILES if not (Path(args.data) / n).is_file()]
    if missing:
        p.error(f"--data {args.data}: no {', '.join(missing)} (the shared real comments)")
    started = start_report(args.report, "benchmarks.serving.languages")
    result = measure(Path(args.data))
    show_and_keep(result, "languages", "benchmarks.serving.languages", args.report, argv, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
