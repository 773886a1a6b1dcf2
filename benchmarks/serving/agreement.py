"""Perspective's Python sample against `jaxtpu serve`, next to `jaxtpu predict` on the same
comments: the largest difference of each attribute's score, and the same comments' scores from
a second server process sent in another order and other batch mixes (the reproducibility of a
score across processes and batches).

`python -m benchmarks.serving.agreement --workdir RUN [--rows 200] [--out DIR]`

The sample is google-api-python-client's `discovery.build("commentanalyzer", "v1alpha1",
discoveryServiceUrl=..., developerKey=...)` then `comments().analyze(body=...).execute()`, as
Perspective documented it, one comment a call, through a real socket; the second server gets
the comments from 16 concurrent clients in reverse order.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.serving.throughput import _start, _stop, _wait_ready, comments


def _sample(url: str, texts: list[str], names: list[str]) -> list[dict[str, float]]:
    from googleapiclient import discovery

    client = discovery.build(
        "commentanalyzer",
        "v1alpha1",
        developerKey="not-checked",
        discoveryServiceUrl=f"{url}/$discovery/rest?version=v1alpha1",
        static_discovery=False,
    )
    out = []
    for text in texts:
        body = {"comment": {"text": text}, "requestedAttributes": {n: {} for n in names}}
        got = client.comments().analyze(body=body).execute()
        out.append({n: got["attributeScores"][n]["summaryScore"]["value"] for n in names})
    return out


def _crowd(url: str, texts: list[str], names: list[str]) -> list[dict[str, float]]:
    import httpx

    def one(text: str) -> dict[str, float]:
        body = {"comment": {"text": text}, "requestedAttributes": {n: {} for n in names}}
        got = httpx.post(f"{url}/v1alpha1/comments:analyze", json=body, timeout=120).json()
        return {n: got["attributeScores"][n]["summaryScore"]["value"] for n in names}

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(reversed(list(pool.map(one, list(reversed(texts))))))


def predicted(workdir: str, texts: list[str], out: Path) -> list[dict[str, str]]:
    """`jaxtpu predict` of `texts` by the run (its own process; the CSV in `out`): a row of
    column -> probability for each."""
    with open(out / "comments.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text"])
        w.writerows([i, t] for i, t in enumerate(texts))
    subprocess.run(
        [sys.executable, "-m", "jaxtpu.predict", "--workdir", workdir, "--input",
         str(out / "comments.csv"), "--output", str(out / "predict.csv"), "--overwrite"],
        check=True, capture_output=True,
    )  # fmt: skip
    with open(out / "predict.csv", newline="") as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.agreement", description=__doc__)
    p.add_argument("--workdir", required=True, help="a finished toxicity or multilabel run")
    p.add_argument("--rows", type=int, default=200, help="real comments (default: 200)")
    p.add_argument("--out", default="runs/serve-agreement", help="where predict's CSV goes")
    args = p.parse_args(argv)
    if not (Path(args.workdir) / "config.json").is_file():
        p.error(f"--workdir {args.workdir}: not a jaxtpu run directory (no config.json)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = comments(args.rows)
    rows = predicted(args.workdir, texts, out)
    runs = []
    for i in range(2):
        cmd = [sys.executable, "-m", "jaxtpu.serve", "--workdir", args.workdir, "--port", "0"]
        proc, url = _start(cmd, "serving")
        try:
            _wait_ready(url)
            import httpx

            card = httpx.get(f"{url}/v1/model").json()
            attrs = card["attributes"]
            names = [a["name"] for a in attrs]
            runs.append((card["version"], (_sample if i == 0 else _crowd)(url, texts, names)))
        finally:
            _stop(proc)
    result = {"rows": len(texts), "versions": [v for v, _ in runs], "attributes": {}}
    for a in attrs:
        want = np.array([float(r[a["column"]]) for r in rows])
        first = np.array([s[a["name"]] for s in runs[0][1]])
        second = np.array([s[a["name"]] for s in runs[1][1]])
        result["attributes"][a["name"]] = {
            "column": a["column"],
            "max_abs_vs_predict": float(np.max(np.abs(first - want))),
            "max_abs_between_servers": float(np.max(np.abs(first - second))),
            "bitwise_equal_between_servers": bool(np.array_equal(first, second)),
        }
    (out / "agreement.json").write_text(json.dumps(result, indent=1))
    print(f"{len(texts)} real comments; model versions {', '.join(result['versions'])}")
    print("| attribute | column | max abs vs jaxtpu predict | max abs between two servers |")
    print("|---|---|---|---|")
    for name, r in result["attributes"].items():
        print(
            f"| {name} | {r['column']} | {r['max_abs_vs_predict']:.2e} | "
            f"{r['max_abs_between_servers']:.2e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
