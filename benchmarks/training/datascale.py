"""Data at Jigsaw scale: peak host memory and time of jaxtpu's data preparation, of a short
training run and of a plain `tokenizers` baseline, on the real comments repeated to size.

`python -m benchmarks.training.datascale --out runs/datascale --rows 10000,230000,2000000`

For each size N it writes `train-N.csv` (the real comments of ../shared/data repeated, each
copy with its own ids) once, and measures, each in a process of its own (peak RSS is the
process's own `ru_maxrss`, from `wait4`; CPU is user + system):

  baseline   read the CSV with the csv module and fill an int32 array in chunks of 10,000
             with the fast tokenizer's `encode_batch`: only the encoding, the floor to beat
  prepare    `jaxtpu.core.data.taskdata.load_task_data` with a fresh token cache (first run) ...
  cached     ... and again with that cache (the second run maps it)
  train      `jaxtpu.train --preset minilm --max-steps 2 --buckets none` on the file (cache
             warm), the whole command: data preparation, compilation, two steps, one
             evaluation (without buckets every size compiles the same program; with them, the
             two steps' lengths, and so the programs and their memory, differ by size)
  predict    `jaxtpu.predict` of the whole file, in its chunks, with a tiny random-init model
             at length 128 trained for 2 steps once per sitting (MiniLM would take hours to
             score 2 M comments on this CPU; memory is the question here, and it is the
             chunk's, not the model's)

The validation file is the same 500 real comments for every size. MiniLM's tokenizer, length
128. Rows print as they finish; `--out`/datascale.json keeps them all.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import REAL_CSV

MAX_LEN = 128
ROOT = Path(__file__).resolve().parents[2]


def write_repeated(real_csv: Path, path: Path, n: int) -> Path:
    """`n` rows of the real file, repeated from its start, each copy's ids suffixed."""
    if path.exists():
        return path
    with open(real_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for i in range(n):
            row = dict(rows[i % len(rows)])
            row["id"] = f"{row['id']}-{i // len(rows)}"
            w.writerow(row)
    os.replace(tmp, path)
    return path


def measured(
    cmd: list[str], env: dict[str, str] | None = None, keep_output: bool = False
) -> dict[str, Any]:
    """Runs `cmd`, returns its wall and CPU seconds and peak RSS (GB), and its JSON line when
    the last line of its output is one (`keep_output`: its whole output too, as 'output')."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    row = {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2),
    }
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if last.startswith("{"):
        row.update(json.loads(last))
    if keep_output:
        row["output"] = out
    return row


# --------------------------------------------------------------------------- in the child


def baseline(csv_path: str) -> None:
    """The tokenizers floor: csv rows -> encode_batch in chunks of 10,000 -> an int32 array."""
    import numpy as np
    from tokenizers import Tokenizer

    from jaxtpu.core.hf.encoder import packaged_minilm_dir

    tok = Tokenizer.from_file(str(Path(packaged_minilm_dir()) / "tokenizer.json"))
    tok.enable_truncation(MAX_LEN)
    tok.enable_padding(length=MAX_LEN)
    parts, chunk = [], []
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            chunk.append(" ".join(row["comment_text"].split()))
            if len(chunk) == 10_000:
                parts.append(np.array([e.ids for e in tok.encode_batch(chunk)], np.int32))
                chunk = []
    if chunk:
        parts.append(np.array([e.ids for e in tok.encode_batch(chunk)], np.int32))
    ids = np.concatenate(parts)
    print(json.dumps({"rows": int(ids.shape[0])}))


def prepare(csv_path: str, valid: str, cache: str) -> None:
    """jaxtpu's data preparation as `jaxtpu.train` runs it."""
    from jaxtpu.core.data import taskdata
    from jaxtpu.core.data.tokens import load_tokenizer
    from jaxtpu.core.flags.presets import minilm
    from jaxtpu.core.hf.encoder import packaged_minilm_dir

    cfg = minilm().replace(train_csv=csv_path, valid_csv=valid, cache_dir=cache)
    data = taskdata.load_task_data(cfg, load_tokenizer(packaged_minilm_dir()))
    print(json.dumps({"rows": len(data.train), "cache_hit": data.info["token_cache_hit"]}))


# --------------------------------------------------------------------------- the sitting

STEPS = {
    "baseline": "`tokenizers` alone",
    "prepare": "data preparation, first run",
    "cached": "data preparation, second run",
    "train": "`jaxtpu.train`, 2 steps",
    "predict": "`jaxtpu.predict`, whole file",
}


def table(results: list[dict]) -> str:
    """Peak RSS (GB) and wall / CPU seconds of each step, a column per size."""
    sizes = [r["rows"] for r in results]
    head = "| step | " + " | ".join(f"{n:,} rows" for n in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    for key, name in STEPS.items():
        cells = []
        for r in results:
            m = r.get(key)
            cells.append(
                f"{m['peak_rss_gb']:.2f} GB, {m['wall_s']:.1f} s ({m['cpu_s']:.0f} CPU-s)"
                if m
                else "-"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the files and datascale.json")
    p.add_argument("--rows", default="10000,230000,2000000", help="sizes (default: %(default)s)")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments (default: %(default)s)")
    p.add_argument("--no-train", action="store_true", help="skip the training runs")
    p.add_argument("--no-predict", action="store_true", help="skip the predict runs")
    p.add_argument(
        "--table", action="store_true", help="print OUT/datascale.json as a markdown table"
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/datascale.json, the table docs/data.md shows",
    )
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    p = _parser()
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads((Path(args.out) / "datascale.json").read_text())))
        return
    if args.child:
        {"baseline": baseline, "prepare": prepare}[args.child[0]](*args.child[1:])
        return
    real, out = Path(args.csv), Path(args.out)
    if not real.exists():
        p.error(f"--csv {real}: not found (see ../shared/data/SOURCES.md)")
    started = start_report(args.report, "benchmarks.training.datascale")  # the code and machine
    out.mkdir(parents=True, exist_ok=True)
    with open(real, newline="", encoding="utf-8") as f:
        head = list(itertools.islice(csv.reader(f), 501))  # the header and 500 rows
    valid = out / "valid-500.csv"
    with open(valid, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(head)
    scorer = out / "tiny-run"
    if not args.no_predict:
        print("training the tiny scoring model", flush=True)
        shutil.rmtree(scorer, ignore_errors=True)
        measured(
            [
                sys.executable,
                "-m",
                "jaxtpu.train",
                "--preset",
                "tiny",
                "--max-len",
                str(MAX_LEN),
                "--train-csv",
                str(valid),
                "--max-steps",
                "2",
                "--workdir",
                str(scorer),
            ]
        )
    results = []
    for n in [int(x) for x in args.rows.split(",")]:
        row = _size(n, real, out, valid, scorer, args)
        print(json.dumps(row), flush=True)
        results.append(row)
        (out / "datascale.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    if args.report:
        kept = keep_report(
            args.report, "datascale", results, "benchmarks.training.datascale", argv, started
        )
        print(f"kept {kept}")


def _size(n: int, real: Path, out: Path, valid: Path, scorer: Path, args: Any) -> dict:
    """One size's row: the file, the baseline read, preparing it cold and cached, training
    (unless --no-train) and predicting (unless --no-predict) on it."""
    me = [sys.executable, "-m", "benchmarks.training.datascale", "--out", str(out), "--child"]
    print(f"{n} rows: writing the file", flush=True)
    train = write_repeated(real, out / f"train-{n}.csv", n)
    cache = out / f"cache-{n}"
    shutil.rmtree(cache, ignore_errors=True)
    row: dict = {"rows": n, "file_mb": round(train.stat().st_size / 2**20, 1)}
    row["baseline"] = measured([*me, "baseline", str(train)])
    row["prepare"] = measured([*me, "prepare", str(train), str(valid), str(cache)])
    row["cached"] = measured([*me, "prepare", str(train), str(valid), str(cache)])
    if not args.no_train:
        run = out / f"run-{n}"
        shutil.rmtree(run, ignore_errors=True)
        row["train"] = measured(
            [
                sys.executable,
                "-m",
                "jaxtpu.train",
                "--preset",
                "minilm",
                "--train-csv",
                str(train),
                "--valid-csv",
                str(valid),
                "--max-steps",
                "2",
                "--buckets",
                "none",
                "--cache-dir",
                str(cache),
                "--workdir",
                str(run),
                "--no-progress",
            ]
        )
        shutil.rmtree(run, ignore_errors=True)
    if not args.no_predict:
        scores = out / f"scores-{n}.csv"
        row["predict"] = measured(
            [
                sys.executable,
                "-m",
                "jaxtpu.predict",
                "--workdir",
                str(scorer),
                "--input",
                str(train),
                "--output",
                str(scores),
                "--overwrite",
            ]
        )
        scores.unlink()
    shutil.rmtree(cache, ignore_errors=True)
    return row


if __name__ == "__main__":
    main()
