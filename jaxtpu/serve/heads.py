"""`jaxtpu head` (`python -m jaxtpu.serve.heads`): a community's head on the frozen served
model, from its moderators' decisions, into a directory of heads that `jaxtpu serve
--communities DIR` serves (`jaxtpu.core.serving.heads`).

The run is loaded as the server loads it (`load_served`: the same version, so a server of it
accepts the head) and scores each decision's comment once: its probabilities and its vector
under the head, from one pass, kept in DIR/.cache/ by the base's version and the comment, so
the next head of the same base reads what it has already scored. The run's files are only
read.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxtpu.core import files
from jaxtpu.core.data.history.rows import TEXT_COLUMNS
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.errors import DataError, UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.serving import heads
from jaxtpu.serve.backends import Served, load_served

CACHE = ".cache"


def read_decisions(
    path: str, label_column: str | None, default_column: str, community: str | None
) -> tuple[list[str], np.ndarray, str]:
    """(comments, 1 removed / 0 kept, the community) of a decisions file; rows without a
    decision skipped, a decision outside [0, 1] refused in one line."""
    table = open_table(path)
    text = next((c for c in TEXT_COLUMNS if c in table.header), None)
    if label_column is None:
        label_column = default_column if default_column in table.header else "decision"
    if text is None or label_column not in table.header:
        raise DataError(
            f"{path}: expected a text column ({', '.join(TEXT_COLUMNS)}) and the decision's "
            f"column ({label_column}); found: {', '.join(table.header)[:300]}"
        )
    by_community = "community" in table.header
    texts, labels, communities = [], [], set()
    for where, row in table.rows():
        if by_community and community is not None and row.get("community") != community:
            continue
        value = (row.get(label_column) or "").strip()
        if not value:
            continue
        try:
            y = float(value)
        except ValueError:
            raise DataError(f"{path}, {where}: {label_column} is {value!r}, not a number") from None
        if not 0.0 <= y <= 1.0:
            raise DataError(f"{path}, {where}: {label_column} is {y}, outside [0, 1]")
        texts.append(row[text])
        labels.append(1.0 if y >= 0.5 else 0.0)
        if by_community:
            communities.add(row.get("community") or "")
    if community is None:
        if len(communities) != 1:
            named = ", ".join(sorted(communities)[:5]) or "none (no community column)"
            raise UserError(
                f"--decisions {path}: holds communities {named}; name one with --community"
            )
        community = communities.pop()
    if not texts:
        raise DataError(f"{path}: no decisions of community {community!r} in {label_column}")
    return texts, np.array(labels), community


def encode(served: Served, texts: list[str], out: Path) -> tuple[np.ndarray, np.ndarray]:
    """Each comment's probabilities (N, columns) and vector (N, hidden) under the served model,
    read from DIR/.cache/<version>.npz where scored before, the rest scored now and kept."""
    cache = out / CACHE / f"{served.version}.npz"
    keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    known: dict[str, np.ndarray] = {}
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as z:
                known = dict(zip(z["keys"].tolist(), z["rows"], strict=True))
        except (OSError, ValueError, KeyError):
            print(f"note: {cache} could not be read; scoring again", file=sys.stderr)
    todo = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in known}.items())
    if todo:
        t0 = time.perf_counter()
        print(f"scoring {len(todo):,} comment(s) with {served.source} "
              f"({len(texts) - len(todo):,} cached) ...", file=sys.stderr, flush=True)  # fmt: skip
        rows = served.probabilities([t for _, t in todo])
        known.update(zip([k for k, _ in todo], rows, strict=True))
        print(f"scored in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        buffer = io.BytesIO()
        np.savez(buffer, keys=np.array(list(known)), rows=np.stack(list(known.values())))
        files.write_bytes(cache, buffer.getvalue())
    rows = np.stack([known[k] for k in keys])
    k = len(served.columns)
    return rows[:, :k], rows[:, k:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(
        "head",
        "Train a community's head on the frozen served model from its moderators' decisions: a "
        "regularised logistic regression from the model's vector and probabilities of a comment "
        "to the probability that this community removes it, the regularisation chosen by "
        "cross-validation on the decisions. The model is never changed; jaxtpu serve "
        "--communities DIR answers the community's requests with the head and every other "
        "attribute with the model.",
        epilog="Example: jaxtpu feedback export --community Coral:https://news.example/ ... "
        "--out news.csv; jaxtpu head --workdir runs/base --decisions news.csv --out heads/",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("head", args)
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out}: not a directory")
        kind = "workdir" if args.workdir else "onnx"
        source = args.workdir or args.onnx
        served = load_served(source, kind, "", "", args.num_devices, args.batch_size, None,
                             pooled=True)  # fmt: skip
        if served.rules_model:
            raise UserError(f"{served.source}: a rules model; a head reads comments")
        attribute = next((a for a in served.attributes if a.name == args.attribute), None)
        if attribute is None:
            names = ", ".join(a.name for a in served.attributes)
            raise UserError(f"--attribute {args.attribute}: the run answers {names}")
        texts, removed, community = read_decisions(
            args.decisions, args.label_column, attribute.column, args.community
        )
        out.mkdir(parents=True, exist_ok=True)
        probs, pooled = encode(served, texts, out)
        record = {
            "community": community,
            "attribute": attribute.name,
            "column": attribute.column,
            "columns": tuple(served.columns),
            "base_version": served.version,
        }
        result = heads.fit(pooled, probs, removed, record, folds=args.folds)
        r = result.head.record
        tried = ", ".join(f"{s:g}: {auc:.4f}" for s, auc in result.tried.items())
        print(f"{community}: {r.decisions} decisions ({r.removed} removed); cross-validated AUC "
              f"by L2 strength: {tried}")  # fmt: skip
        if min(r.removed, r.decisions - r.removed) < heads.FEW_CLASS:
            print(f"note: fewer than {heads.FEW_CLASS} decisions of a class: the choice rests on "
                  "a few of them; read the AUC beside the base's", file=sys.stderr)  # fmt: skip
        path = out / heads.file_name(community)
        if path.exists():  # kept, and replaced in one step: a server never finds it missing
            shutil.copyfile(path, path.with_name(path.name + ".prev"))
        version = heads.save(result.head, path)
        print(f"wrote {path} ({version}): {r.attribute} for {community!r}, strength "
              f"{r.strength:g}, cross-validated AUC {r.cv_auc:.4f} against the base's "
              f"{r.base_auc:.4f} on the same decisions, fitted in {r.seconds:.1f} s; base "
              f"{r.base_version} unchanged")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
