"""A community's head on the frozen model, beside `benchmarks.quality.community`'s fine-tune (issue
96 item 4): the same base, forums, decisions' pool and unseen comments, the same loop up to the
export (a server keeps Coral's decisions, `jaxtpu feedback export` writes them), then `jaxtpu
head` instead of `jaxtpu train --init-from`; then 1,000 heads served on one server.

`python -m benchmarks.quality.community_heads [--forum profanity] [--queue all] [--decisions
100,300,1000] [--out runs/community] [--heads 1000] [--report FILE]`

For each N: the forum's AUC on its unseen comments before (the base's TOXICITY) and after (the
head's), and beside it against Jigsaw's own `toxic` of the same comments; the head's chosen
strength and cross-validated AUC; the loop's wall time (decisions, export, `jaxtpu head`: its
process, the model's load, the encoder pass over the decisions not cached yet, the fit) and
the fit's alone. The original validation is the base's whatever the head: every file of the
base run is hashed before and after and compared (bitwise).

Served: two servers of the base side by side, one plain, one with `--communities DIR` of
`--heads` heads (the N=300 head under that many community ids), the same real comments sent
to each in turn (each request to the second naming one of the communities, in turn): the
median and mean time of a request, and each server's resident memory (VmRSS) after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quality.community import (
    FORUM,
    FORUMS,
    _cli,
    _decide,
    base_run,
    flagged_first,
    split_rows,
)
from benchmarks.serving.clients import _call
from benchmarks.serving.throughput import REAL_CSV, _start, _stop, _wait_ready
from benchmarks.shared.machine import cpu_record
from benchmarks.shared.measured import show_and_keep
from benchmarks.shared.measured import start as start_report
from jaxtpu.core.metrics import roc_auc
from jaxtpu.core.serving import heads

SERVED_REQUESTS = 300  # per server, after a warm-up of 30


def _digest(run: Path) -> str:
    """One hash of every file of a run directory (names and bytes)."""
    h = hashlib.sha256()
    for p in sorted(run.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(run)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _vectors(base: Path, texts: list[str], cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """The base's (probabilities, vectors) of `texts`, as `jaxtpu head` and the server read
    them (`jaxtpu.serve.heads.encode`: cached in `cache`)."""
    from jaxtpu.serve.backends import load_served
    from jaxtpu.serve.heads import encode

    served = load_served(str(base), "workdir", "", "", 0, 32, None, pooled=True)
    return encode(served, texts, cache)


def one_size(n: int, base: Path, pool: list[dict], rule, test: tuple, out: Path) -> dict:
    """The loop for the first `n` decisions, ending in a head (in `out`/n`n`)."""
    here = out / f"n{n}"
    here.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    _decide(base, pool[:n], rule, here / "feedback.db")
    decisions = here / "decisions.csv"
    _cli("jaxtpu.feedback", "export", "--feedback", here / "feedback.db", "--out", decisions,
         "--community", FORUM, "--workdir", base, "--overwrite")  # fmt: skip
    t1 = time.time()
    _cli("jaxtpu.serve.heads", "--workdir", base, "--decisions", decisions,
         "--out", out / "heads", "--community", FORUM)  # fmt: skip
    done = time.time()
    head = heads.load(out / "heads" / heads.file_name(FORUM))
    probs, vectors, labels = test
    after = head.probability(vectors, probs)
    path = here / heads.file_name(FORUM)
    path.write_bytes((out / "heads" / heads.file_name(FORUM)).read_bytes())  # kept per N
    r = head.record
    return {
        "decisions": n,
        "deleted": r.removed,
        "community_auc_after": roc_auc(after, labels[0]),
        "jigsaw_toxic_auc_after": roc_auc(after, labels[1]),
        "strength": r.strength,
        "cv_auc": r.cv_auc,
        "decisions_base_auc": r.base_auc,
        "fit_seconds": r.seconds,
        "head_command_seconds": done - t1,
        "loop_seconds": done - t0,
        "head": str(path),
    }


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def served(base: Path, head_file: Path, count: int, texts: list[str], out: Path) -> dict:
    """A plain server of the base and one with `count` heads (copies of `head_file` under as
    many community ids), the same comments sent to each in turn: request times and memory."""
    folder = out / f"heads-{count}"
    folder.mkdir(parents=True, exist_ok=True)
    head = heads.load(head_file)
    for i in range(count):
        record = heads.Record(**{**vars(head.record), "community": f"forum-{i}"})
        copy = heads.Head(record, head.mean, head.scale, head.weights, head.bias)
        heads.save(copy, folder / heads.file_name(record.community))
    plain_cmd = [sys.executable, "-m", "jaxtpu.serve", "--workdir", str(base), "--port", "0"]
    plain, plain_url = _start(plain_cmd, "serving")
    many, many_url = _start([*plain_cmd, "--communities", str(folder)], "serving")
    times: dict[str, list[float]] = {"plain": [], "heads": []}
    try:
        _wait_ready(plain_url)
        _wait_ready(many_url)
        for i, text in enumerate(texts[: SERVED_REQUESTS + 30]):
            body = {"comment": {"text": text}, "languages": ["en"],
                    "requestedAttributes": {"TOXICITY": {}}}  # fmt: skip
            named = {"communityId": f"forum-{i % count}"}
            for name, url, extra in (("plain", plain_url, {}), ("heads", many_url, named)):
                t0 = time.perf_counter()
                status, _, _ = _call(f"{url}/v1alpha1/comments:analyze", {**body, **extra})
                if status != 200:
                    raise SystemExit(f"{name}: answered {status}")
                if i >= 30:
                    times[name].append(time.perf_counter() - t0)
        memory = {"plain": _rss_mb(plain.pid), "heads": _rss_mb(many.pid)}
        card = _call(f"{many_url}/v1/model", method="GET")[2]
    finally:
        _stop(plain)
        _stop(many)
    ms = {k: [x * 1000 for x in v] for k, v in times.items()}
    return {
        "heads": count,
        "heads_served": len(card.get("heads", {}).get("heads", {})),
        "requests": len(times["plain"]),
        "median_ms": {k: statistics.median(v) for k, v in ms.items()},
        "mean_ms": {k: statistics.fmean(v) for k, v in ms.items()},
        "rss_mb": memory,
        "head_file_bytes": head_file.stat().st_size,
    }


def run(sizes: list[int], out: Path, forum_name: str, queue: str, count: int) -> dict[str, Any]:
    rule = FORUMS[forum_name]
    here = out / (f"{forum_name}-heads" if queue == "all" else f"{forum_name}-{queue}-heads")
    here.mkdir(parents=True, exist_ok=True)
    base_rows, pool, test_rows = split_rows()
    base = base_run(out, base_rows)
    before = _digest(base)
    flagged = None
    if queue == "flagged":
        pool, flagged = flagged_first(base, pool, here)
    labels = np.array(
        [[rule(r) for r in test_rows], [float(r["toxic"]) >= 0.5 for r in test_rows]],
        np.float64,
    )
    probs, vectors = _vectors(base, [r["comment_text"] for r in test_rows], here / "heads")
    toxic = probs[:, 0]  # the base's TOXICITY (`toxic`, the multilabel run's first column)
    test = (probs, vectors, labels)
    rows = []
    for n in sizes:
        print(f"N = {n} decisions ({forum_name}), a head ...", flush=True)
        rows.append(one_size(n, base, pool, rule, test, here))
    summary = json.loads((base / "summary.json").read_text())
    middle = next((r for r in rows if r["decisions"] == 300), rows[0])
    serving = served(base, Path(middle["head"]), count, [r["comment_text"] for r in test_rows],
                     here) if count else None  # fmt: skip
    result = {
        "forum": forum_name, "queue": queue, "flagged": flagged, "rows": rows,
        "community_auc_before": roc_auc(toxic, labels[0]),
        "jigsaw_toxic_auc_before": roc_auc(toxic, labels[1]),
        "original": summary["best"]["value"], "original_name": summary["monitor"],
        "base_unchanged": _digest(base) == before,
        "test_rows": len(test_rows), "test_deleted": int(labels[0].sum()),
        "served": serving, "cpu": cpu_record(),
    }  # fmt: skip
    (here / "community_heads.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict[str, Any]) -> str:
    """Each N's head against the base, then the served heads' cost."""
    b, j = result["community_auc_before"], result["jigsaw_toxic_auc_before"]
    queue = "" if result.get("queue", "all") == "all" else (
        f"; decided: the {result['flagged']} comments the base flags first")  # fmt: skip
    lines = [
        f"The forum ({result['forum']}{queue}): {result['test_rows']} unseen comments "
        f"({result['test_deleted']} deleted by its rule); the base's forum AUC {b:.4f} (room "
        f"{1 - b:.4f}), its Jigsaw toxic AUC {j:.4f}.",
        "",
        "| decisions | deleted | forum AUC with the head | change | share of the room | Jigsaw "
        "toxic AUC: change | L2 strength chosen | cross-validated AUC (base's) | fit | loop "
        "wall time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        c = r["community_auc_after"] - b
        lines.append(
            f"| {r['decisions']} | {r['deleted']} | {r['community_auc_after']:.4f} | {c:+.4f} | "
            f"{c / (1 - b):.0%} | {r['jigsaw_toxic_auc_after'] - j:+.4f} | {r['strength']:g} | "
            f"{r['cv_auc']:.4f} ({r['decisions_base_auc']:.4f}) | {r['fit_seconds']:.1f} s | "
            f"{r['loop_seconds']:.0f} s |"
        )
    same = "bitwise the same" if result["base_unchanged"] else "CHANGED"
    lines += ["", f"The original validation ({result['original_name']} "
              f"{result['original']:.4f}) is the base's: every file of the base run is {same} "
              "after the heads were trained."]  # fmt: skip
    s = result.get("served")
    if s:
        m, t = s["rss_mb"], s["median_ms"]
        lines += [
            "",
            f"Served: {s['heads_served']:,} heads of {s['head_file_bytes']:,} bytes each "
            f"beside a plain server of the base, {s['requests']} real comments to each in turn: "
            f"median request {t['plain']:.1f} ms plain, {t['heads']:.1f} ms with the heads "
            f"({t['heads'] / t['plain'] - 1:+.1%}); mean {s['mean_ms']['plain']:.1f} / "
            f"{s['mean_ms']['heads']:.1f} ms; resident memory {m['plain']:.0f} MB plain, "
            f"{m['heads']:.0f} MB with the heads ({m['heads'] - m['plain']:+.0f} MB).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.community_heads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--forum",
        choices=sorted(FORUMS),
        default="profanity",
        help="the forum's rule (as benchmarks.quality.community's)",
    )
    p.add_argument(
        "--queue",
        choices=("all", "flagged"),
        default="all",
        help="what the moderators decide (as benchmarks.quality.community's)",
    )
    p.add_argument(
        "--decisions",
        default="100,300,1000",
        help="how many decisions, comma-separated (default: 100,300,1000)",
    )
    p.add_argument(
        "--out",
        default="runs/community",
        help="where its files go; the base run is benchmarks.quality.community's",
    )
    p.add_argument(
        "--heads",
        type=int,
        default=1000,
        help="heads on the served comparison (0: none; default 1000)",
    )
    p.add_argument(
        "--report",
        help="also keep the result as a measured report, e.g. docs/measured/community-heads.json",
    )
    args = p.parse_args(argv)
    if not REAL_CSV.is_file():
        p.error(f"{REAL_CSV}: the real comments are not here (see ../shared/data/SOURCES.md)")
    started = start_report(args.report, "benchmarks.quality.community_heads")
    sizes = [int(x) for x in args.decisions.split(",")]
    result = run(sizes, Path(args.out), args.forum, args.queue, args.heads)
    show_and_keep(
        result, "community_heads", "benchmarks.quality.community_heads", args.report, argv, started
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
