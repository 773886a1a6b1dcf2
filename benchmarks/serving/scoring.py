"""Scoring speed on a CPU, side by side with the tools people deploy with: comments per second
of the same MiniLM toxicity model on the same real comments in the same batches, each way in a
process of its own, several rounds.

`python -m benchmarks.serving.scoring --out runs/scoring [--workdir RUN] [--rows 2000] [--rounds 3]`

The model: a MiniLM run trained with the family's own head (`--head hf`, so that transformers'
pipeline loads its export), `jaxtpu train --preset minilm --head hf` for one epoch on the 8,000
real comments of the file that are not in the default run's sample (OUT/train.csv; about 10
minutes here), unless `--workdir` names a finished run of that kind. Its exports are written
once into OUT (`export --format hf`, and `--format onnx --quantize int8`).

The comments: `--rows` of `../shared/data/jigsaw_toxic_dev.csv` (the default run's 2,000
first, which OUT/run did not train on, then the file's others), normalized as jaxtpu reads
them and **sorted by their length in tokens** (OUT/comments-ROWS.csv), the same
list for every way, so every way's batches of 32 hold comments of about one length, as any
deployer batches them (jaxtpu adds its length buckets on top):

  jaxtpu-predict   `python -m jaxtpu.predict --workdir RUN --input CSV --output X`: the whole
                   command; its rate is the one it reports (reading, tokenizing, compiling
                   each length bucket and scoring, from the start of the stream), on
                   its default devices (one on a CPU; SCORING_DEVICES=N in the environment
                   gives both jaxtpu ways N virtual devices)
  jaxtpu-api       `jaxtpu.load(RUN).predict(texts)`, called twice: the first call compiles
                   each length bucket's program once ('first call s'), the second is a
                   long-lived model's rate
  pipeline-fp32    transformers' `pipeline("text-classification", top_k=None)` on the hf
                   export: PyTorch eager fp32, batches of 32, truncated at the run's length
  pipeline-bf16    the same under `torch.autocast("cpu", dtype=torch.bfloat16)`
  onnx-fp32        onnxruntime (CPU provider, its default threads) on model.onnx (the graph
                   fused for onnxruntime), batches of 32 each padded to its longest comment,
                   tokenized by the export's tokenizer through transformers (what optimum's
                   pipelines do)
  onnx-int8        the same on model_int8.onnx (onnxruntime's dynamic quantization)

Rounds: every way runs once per round, the ways in turn (so a slow minute of the machine falls
on all of them), `--rounds` times. Each row of the table: the median comments/s of the scoring
(the model loaded; for jaxtpu-predict the command's own figure) and the slowest and fastest
round, the median load time and process wall time, the largest peak RSS (`wait4`), the ROC AUC
on the comments the model did not train on (the default run's 2,000, when it trained on OUT/
train.csv) and the largest difference of each comment's probability from jaxtpu's. Below it,
the ratios the deployment questions ask (onnxruntime fp32 over PyTorch eager fp32, int8 over
fp32 and its AUC loss, jaxtpu over the best peer at its precision, bf16). Rows print as they
finish; OUT/scoring.json keeps every round, `--table` prints the table again.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.shared.machine import cpu_line, cpu_record
from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from benchmarks.training.datascale import measured
from parity_tests.competitions import REAL_CSV

MODULE = "benchmarks.serving.scoring"
WAYS = ("jaxtpu-predict", "jaxtpu-api", "pipeline-fp32", "pipeline-bf16", "onnx-fp32", "onnx-int8")
BATCH = 32  # the other tools' batch size (jaxtpu scores its default --batch-size per device)


ROUNDS = 3


def _texts(csv_path: str, rows: int) -> tuple[list[str], list[float]]:
    from jaxtpu.core.data.readers import read_comments

    data = read_comments(csv_path)
    return list(data.texts[:rows]), [float(x) for x in data.labels[:rows]]


# --------------------------------------------------------------------------- in the child


def _jaxtpu_api(run: str, texts: list[str]) -> tuple[object, dict]:
    import jaxtpu

    t0 = time.perf_counter()
    devices = os.environ.get("SCORING_DEVICES")  # default: jaxtpu's (one device on a CPU)
    model = jaxtpu.load(run, num_devices=int(devices) if devices else None)
    t1 = time.perf_counter()
    model.predict(texts)  # compiles each length bucket once
    t2 = time.perf_counter()
    probs = model.predict(texts)
    t3 = time.perf_counter()
    return probs, {"load_s": t1 - t0, "first_s": t2 - t1, "score_s": t3 - t2}


def _pipeline(hf: str, texts: list[str], max_len: int, bf16: bool) -> tuple[object, dict]:
    import contextlib

    import numpy as np
    import torch
    from transformers import pipeline

    t0 = time.perf_counter()
    pipe = pipeline("text-classification", model=hf, top_k=None, device="cpu")
    t1 = time.perf_counter()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.inference_mode(), autocast:
        rows = pipe(texts, batch_size=BATCH, truncation=True, max_length=max_len)
    t2 = time.perf_counter()
    probs = np.array([{r["label"]: r["score"] for r in row}["toxic"] for row in rows])
    return probs, {"load_s": t1 - t0, "score_s": t2 - t1}


def onnx_batches(tok: object, texts: list[str], max_len: int) -> Iterator[dict]:
    """The ONNX ways' batches, tokenized as they are consumed: `BATCH` texts in order, each
    padded to its longest and cut at `max_len`, as the graph's int64 inputs."""
    import numpy as np

    for start in range(0, len(texts), BATCH):
        enc = tok(
            texts[start : start + BATCH],
            truncation=True,
            max_length=max_len,
            padding=True,
            return_tensors="np",
        )
        yield {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}


def _onnx(directory: str, name: str, texts: list[str], max_len: int) -> tuple[object, dict]:
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(directory)
    session = ort.InferenceSession(str(Path(directory) / name), providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    logits = [session.run(None, feeds)[0][:, 0] for feeds in onnx_batches(tok, texts, max_len)]
    t2 = time.perf_counter()
    probs = 1 / (1 + np.exp(-np.concatenate(logits).astype(np.float64)))
    return probs, {"load_s": t1 - t0, "score_s": t2 - t1}


def child(way: str, out: str, run: str, csv_path: str, rows: int, max_len: int) -> None:
    import numpy as np

    texts, _ = _texts(csv_path, rows)
    o = Path(out)
    if way == "jaxtpu-api":
        probs, times = _jaxtpu_api(run, texts)
    elif way.startswith("pipeline"):
        probs, times = _pipeline(str(o / "hf"), texts, max_len, way.endswith("bf16"))
    else:
        name = "model.onnx" if way == "onnx-fp32" else "model_int8.onnx"
        probs, times = _onnx(str(o / "onnx"), name, texts, max_len)
    np.save(o / f"scores-{way}.npy", np.asarray(probs, np.float64))
    print(json.dumps({k: round(v, 2) for k, v in times.items()}))


# --------------------------------------------------------------------------- the sitting


def _cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr[-3000:]}")


def _prepare(out: Path, run: Path, csv_path: Path, rows: int) -> None:
    """The model, its exports and the comments' file (first `rows` rows), once per OUT."""
    if not (run / "summary.json").exists():
        train = out / "train.csv"
        sample = _sample_texts()
        _write_rows(csv_path, train, lambda text: text not in sample)
        print(f"training MiniLM with --head hf on {train} into {run}", flush=True)
        _cli("jaxtpu.train", "--preset", "minilm", "--head", "hf", "--no-progress",
             "--train-csv", str(train), "--workdir", str(run))  # fmt: skip
    if not (out / "hf").exists():
        _cli("jaxtpu.export", "--workdir", str(run), "--out", str(out / "hf"))
    if not (out / "onnx").exists():
        _cli("jaxtpu.export", "--workdir", str(run), "--out", str(out / "onnx"),
             "--format", "onnx", "--quantize", "int8")  # fmt: skip
    _write_sorted(csv_path, out / f"comments-{rows}.csv", rows, out / "hf")


def _write_sorted(src: Path, dst: Path, rows: int, tokenizer_dir: Path) -> None:
    """The header and `rows` rows of `src` (those of the default run's sample first, the
    comments OUT/run did not train on, then the others, each in file order), comments
    normalized, ordered by their length in the export's tokens (ties in file order)."""
    from transformers import AutoTokenizer

    from jaxtpu.core.data.templates import normalize_text

    held_out = _sample_texts()  # the default run's comments: OUT/run never trained on them
    with open(src, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        every = [{**row, "comment_text": normalize_text(row["comment_text"])} for row in reader]
    first = [r for r in every if r["comment_text"] in held_out]
    kept = (first + [r for r in every if r["comment_text"] not in held_out])[:rows]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lengths = [
        len(ids) for ids in tok([r["comment_text"] for r in kept], verbose=False)["input_ids"]
    ]
    order = sorted(range(len(kept)), key=lambda i: lengths[i])
    with open(dst, "w", newline="", encoding="utf-8") as g:
        writer = csv.DictWriter(g, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept[i] for i in order)


def _write_rows(src: Path, dst: Path, keep) -> None:
    """The header and the rows of `src` whose (normalized) comment `keep` accepts."""
    from jaxtpu.core.data.templates import normalize_text

    with (
        open(src, newline="", encoding="utf-8") as f,
        open(dst, "w", newline="", encoding="utf-8") as g,
    ):
        reader = csv.DictReader(f)
        writer = csv.DictWriter(g, fieldnames=reader.fieldnames)
        writer.writeheader()
        writer.writerows(row for row in reader if keep(normalize_text(row["comment_text"])))


def _sample_texts() -> set[str]:
    from jaxtpu.core.data.demo import SAMPLE_CSV
    from jaxtpu.core.data.readers import read_comments

    return set(read_comments(SAMPLE_CSV).texts)


def _held_out(run: Path, texts: list[str]) -> list[bool]:
    """Which comments the run did not train on: not in its training file."""
    from jaxtpu.core.data.readers import read_comments

    train = json.loads((run / "config.json").read_text())["config"]["data"]["train_csv"]
    seen = set(read_comments(train).texts) if train and train != "sample" else _sample_texts()
    return [t not in seen for t in texts]


def summary(rounds: list[dict]) -> list[dict]:
    """One row per way (in the order they ran) from every round's rows: the median and the
    spread of comments/s, the medians of the times, the largest peak RSS."""
    import statistics

    ways = list(dict.fromkeys(r["way"] for r in rounds))
    rows = []
    for way in ways:
        mine = [r for r in rounds if r["way"] == way]

        def median(key: str, mine=mine) -> float | None:
            values = [r[key] for r in mine if key in r]
            return round(statistics.median(values), 2) if values else None

        rate = [r["per_s"] for r in mine]
        rows.append({
            "way": way, "rounds": len(mine), "per_s": statistics.median(rate),
            "per_s_min": min(rate), "per_s_max": max(rate), "load_s": median("load_s"),
            "first_s": median("first_s"), "wall_s": median("wall_s"),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in mine), "auc": mine[-1]["auc"],
            "diff": max(r["diff"] for r in mine), "cpu": mine[-1].get("cpu"),
        })  # fmt: skip
    return rows


def ratios(rows: list[dict]) -> list[str]:
    """The comparisons the deployment questions ask, from the medians (the ways present)."""
    by = {r["way"]: r for r in rows}
    lines = []

    def ratio(a: str, b: str, what: str) -> None:
        if a in by and b in by:
            lines.append(f"{what}: {by[a]['per_s'] / by[b]['per_s']:.2f}x ({a} over {b})")

    ratio("onnx-fp32", "pipeline-fp32", "onnxruntime fp32 over PyTorch eager fp32")
    ratio("onnx-int8", "onnx-fp32", "onnxruntime int8 over onnxruntime fp32")
    if "onnx-int8" in by and "onnx-fp32" in by:
        loss = by["onnx-fp32"]["auc"] - by["onnx-int8"]["auc"]
        lines.append(f"int8's held-out AUC loss: {loss:.4f}")
    ratio("jaxtpu-api", "pipeline-bf16", "jaxtpu.load().predict over PyTorch bf16 autocast")
    ratio("jaxtpu-predict", "pipeline-bf16", "jaxtpu predict over PyTorch bf16 autocast")
    return lines


def report_table(rows: list[dict]) -> str:
    """A kept report's table (`benchmarks.shared.measured`): the rounds' summary; the CPU is in the
    report's caption."""
    return table(summary(rows), cpu=False)


def table(rows: list[dict], cpu: bool = True) -> str:
    head = (
        "| way | comments/s (median) | slowest-fastest round | first call s | load s | "
        "process s | peak RSS | AUC (held out) | max abs prob diff vs jaxtpu |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        first = "-" if r.get("first_s") is None else r["first_s"]
        load = "-" if r.get("load_s") is None else r["load_s"]
        lines.append(
            f"| {r['way']} | {r['per_s']:,.0f} | {r['per_s_min']:,.0f}-{r['per_s_max']:,.0f} | "
            f"{first} | {load} | {r['wall_s']} | {r['peak_rss_gb']:.2f} GB | {r['auc']:.4f} | "
            f"{r['diff']:.1e} |"
        )
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {line}" for line in ratios(rows))
    return text + (f"\n\n{cpu_line(rows[0].get('cpu') if rows else None)}" if cpu else "")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the model, exports and results")
    p.add_argument("--workdir", help="a finished MiniLM --head hf run (default: OUT/run, trained)")
    p.add_argument("--rows", type=int, default=2_000, help="comments (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="rounds (default: %(default)s)")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments (default: %(default)s)")
    p.add_argument("--ways", default=",".join(WAYS), help="which ways (default: all)")
    p.add_argument("--table", action="store_true", help="print OUT/scoring.json as Markdown")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep every round as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/scoring.json, the table docs/elsewhere.md shows",
    )
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        p.error(f"--out {out}: a file; give a directory (new, or one this benchmark wrote)")
    if args.table:
        results = out / "scoring.json"
        if not results.is_file():
            p.error(f"--table: no {results}; run the benchmark into --out {out} first")
        print(table(summary(json.loads(results.read_text()))))
        return
    if args.child:
        way, o, run, c, rows, max_len = args.child
        child(way, o, run, c, int(rows), int(max_len))
        return
    import numpy as np

    from jaxtpu.core import metrics

    csv_path = Path(args.csv)
    if not csv_path.exists():
        p.error(f"--csv {csv_path}: not found (see ../shared/data/SOURCES.md)")
    ways = args.ways.split(",")
    unknown = set(ways) - set(WAYS)
    if unknown:
        p.error(f"--ways: unknown {', '.join(sorted(unknown))}; choose from {', '.join(WAYS)}")
    if args.rounds < 1 or args.rows < 1:
        p.error("--rounds and --rows: at least 1")
    if args.workdir and not (Path(args.workdir) / "summary.json").is_file():
        p.error(
            f"--workdir {args.workdir}: not a finished jaxtpu run (no summary.json); leave it "
            "out to train one into OUT/run"
        )
    out.mkdir(parents=True, exist_ok=True)
    started = start_report(args.report, MODULE)  # the code and machine that measure
    run = Path(args.workdir or out / "run")
    _prepare(out, run, csv_path, args.rows)
    comments = out / f"comments-{args.rows}.csv"
    max_len = json.loads((run / "config.json").read_text())["config"]["data"]["max_len"]
    texts, labels = _texts(str(comments), args.rows)
    held = np.array(_held_out(run, texts))
    labels = np.array(labels)
    print(
        f"{len(texts)} comments sorted by length ({held.sum()} not trained on), length "
        f"{max_len}; {os.cpu_count()} CPUs; {args.rounds} rounds of {', '.join(ways)}",
        flush=True,
    )
    results, reference, cpu = [], None, cpu_record()
    for round_ in range(1, args.rounds + 1):
        for way in ways:
            row = _one(way, out, run, comments, args.rows, max_len, len(texts))
            probs = row.pop("probs")
            if reference is None and way.startswith("jaxtpu"):
                reference = probs
            row["way"], row["round"], row["cpu"] = way, round_, cpu
            row["auc"] = float(metrics.roc_auc(probs[held], labels[held]))
            row["diff"] = float(np.abs(probs - reference).max()) if reference is not None else 0.0
            results.append(row)
            print(json.dumps(row), flush=True)
            (out / "scoring.json").write_text(json.dumps(results, indent=2))
    print(table(summary(results)))
    if args.report:
        kept = keep_report(args.report, "scoring", results, MODULE, argv, started)
        print(f"kept as {kept}")


def _one(way: str, out: Path, run: Path, comments: Path, rows: int, max_len: int, n: int) -> dict:
    """One round of one way, in a process of its own: its measured row, with its
    probabilities as 'probs'."""
    import numpy as np

    if way == "jaxtpu-predict":
        csv_out = out / "predict.csv"
        csv_out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "jaxtpu.predict", "--workdir", str(run), "--input",
               str(comments), "--output", str(csv_out)]  # fmt: skip
        if os.environ.get("SCORING_DEVICES"):
            cmd += ["--num-devices", os.environ["SCORING_DEVICES"]]
        row = measured(cmd, keep_output=True)
        with open(csv_out, newline="", encoding="utf-8") as f:
            row["probs"] = np.array([float(r[1]) for r in list(csv.reader(f))[1:]])
        rate = re.findall(r"scored \d+ rows \((\d+) rows/s\)", row.pop("output", ""))
        row["per_s"] = float(rate[-1]) if rate else n / row["wall_s"]
        return row
    me = [sys.executable, "-m", MODULE, "--out", str(out), "--child"]
    row = measured([*me, way, str(out), str(run), str(comments), str(rows), str(max_len)])
    row["probs"] = np.load(out / f"scores-{way}.npy")
    row["per_s"] = n / row["score_s"]
    return row


if __name__ == "__main__":
    main()
