"""Every Perspective client's way of calling `jaxtpu serve`, against one server of a run, with
each call's status and, where it scores, the largest difference from `jaxtpu predict` of the
same real comments.

`python -m benchmarks.serving.clients --workdir RUN [--rows 100] [--out DIR]`

The calls: Coral Talk's analyze and suggestscore (its endpoint setting with the method joined
to it, `?key=`, its bodies as coralproject/talk builds them), a batch of both methods through
google-api-python-client's `new_batch_http_request()` (HELM's way), a browser's preflight and
cross-origin POST with the key as `X-Goog-Api-Key`, a named key over its quota of 3 requests a
minute, and ten short comments without `languages` (the detector's answer and the server's).
The server keeps suggestions in an SQLite file under DIR, read back at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serving.agreement import predicted
from benchmarks.serving.throughput import _start, _stop, _wait_ready, comments
from benchmarks.shared.machine import cpu_line, cpu_record

ORIGIN = "https://news.example"
KEYS = "coral-key coral\nhelm-key helm\npage-key page\nsmall-key small 3\n"
SHORT = [
    "lol",
    "ok",
    "thanks!",
    "Bonjour",
    "you suck",
    "merci",
    "nice try",
    "fuck off",
    "Danke schön, sehr hilfreich",
    "Tu es vraiment un idiot, va-t'en.",
]


def _call(
    url: str, body: Any = None, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    head = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data, head, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), _json(r.read(), r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), _json(e.read(), e.headers)


def _json(raw: bytes, headers: Any) -> Any:
    return json.loads(raw) if "json" in headers.get("content-type", "") else raw.decode()


def _diff(
    got: list[dict[str, float]], want: list[dict[str, str]], columns: dict[str, str]
) -> float:
    return max(
        float(np.max(np.abs(np.array([g[n] for g in got]) - np.array([float(w[c]) for w in want]))))
        for n, c in columns.items()
    )


def _batch(url: str, texts: list[str], names: list[str]) -> tuple[list[int], list[dict]]:
    from googleapiclient import discovery

    client = discovery.build(
        "commentanalyzer",
        "v1alpha1",
        developerKey="helm-key",
        discoveryServiceUrl=f"{url}/$discovery/rest?version=v1alpha1",
        static_discovery=False,
    )
    got: dict[str, Any] = {}
    for start in range(0, len(texts), 99):  # and a suggestion: 100 calls a batch
        batch = client.new_batch_http_request(
            callback=lambda rid, response, error: got.__setitem__(rid, error or response)
        )
        for i, text in enumerate(texts[start : start + 99], start):
            body = {"comment": {"text": text}, "requestedAttributes": {n: {} for n in names}}
            batch.add(client.comments().analyze(body=body), request_id=str(i))
        suggestion = {
            "comment": {"text": texts[start]},
            "attributeScores": {names[0]: {"summaryScore": {"value": 1}}},
            "clientToken": f"helm:{start}",
        }
        batch.add(client.comments().suggestscore(body=suggestion), request_id=f"s{start}")
        batch.execute()
    statuses = [200 if isinstance(v, dict) else v.resp.status for v in got.values()]
    scores = [got[str(i)]["attributeScores"] for i in range(len(texts))]
    return statuses, [{n: s[n]["summaryScore"]["value"] for n in names} for s in scores]


def _coral(endpoint: str, texts: list[str], want: list[dict], column: str) -> list[dict]:
    """Coral's analyze of every comment and ten moderators' decisions: their rows."""
    coral = [
        _call(
            f"{endpoint}/comments:analyze?key=coral-key",
            {
                "comment": {"text": t},
                "doNotStore": True,
                "requestedAttributes": {"TOXICITY": {}},
                "languages": ["en"],
            },
        )  # fmt: skip
        for t in texts
    ]
    got = [
        {"TOXICITY": c[2]["attributeScores"]["TOXICITY"]["summaryScore"]["value"]} for c in coral
    ]
    suggestions = []
    for i, t in enumerate(texts[:10]):
        body = {
            "comment": {"text": t},
            "context": {"entries": [{"text": json.dumps({"Coral_comment_id": str(i)})}]},
            "attributeScores": {("DELETED", "APPROVED")[i % 2]: {"summaryScore": {"value": 1}}},
            "languages": ["EN"],
            "communityId": "Coral:https://news.example/",
            "clientToken": f"comment:{i}",
        }
        suggestions.append(_call(f"{endpoint}/comments:suggestscore?key=coral-key", body))
    return [
        _row("Coral analyze", coral, _diff(got, want, {"TOXICITY": column})),
        _row("Coral suggestscore", suggestions, None),
    ]


def _page(endpoint: str, texts: list[str], want: list[dict], columns: dict) -> list[dict]:
    """A browser's preflight and cross-origin POSTs with the header key: their rows."""
    preflight = _call(
        f"{endpoint}/comments:analyze",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, x-goog-api-key"},
        method="OPTIONS",
    )  # fmt: skip
    page = [
        _call(
            f"{endpoint}/comments:analyze",
            {"comment": {"text": t}, "requestedAttributes": {n: {} for n in columns}},
            {"Origin": ORIGIN, "X-Goog-Api-Key": "page-key"},
        )
        for t in texts
    ]
    got = [{n: c[2]["attributeScores"][n]["summaryScore"]["value"] for n in columns} for c in page]
    row = _row("page POST, cross-origin, X-Goog-Api-Key", page, _diff(got, want, columns))
    row["allow_origin"] = page[0][1].get("access-control-allow-origin")
    return [_row("page preflight (OPTIONS)", [preflight], None), row]


def _quota(endpoint: str, text: str) -> dict[str, Any]:
    """Five calls of the key allowed 3 a minute: its row."""
    small = [
        _call(
            f"{endpoint}/comments:analyze?key=small-key",
            {"comment": {"text": text}, "requestedAttributes": {"TOXICITY": {}}},
        )
        for _ in range(5)
    ]
    row = _row("key 'small' (3 a minute), 5 calls", small, None)
    row["order"] = [c[0] for c in small]
    row["reason"] = small[-1][2]["error"]["details"][0]["reason"]
    return row


def _languages(endpoint: str) -> list[dict[str, Any]]:
    """The detector's answer on `SHORT`, and the server's to each without `languages`."""
    from jaxtpu.core.serving.languages import Detector

    detector, out = Detector(), []
    for t in SHORT:
        d = detector.detect(t)
        status, _, answer = _call(
            f"{endpoint}/comments:analyze?key=coral-key",
            {"comment": {"text": t}, "requestedAttributes": {"TOXICITY": {}}},
        )
        out.append(
            {"text": t, "detected": d.top, "probability": round(d.probabilities[0], 3),
             "sure": d.sure, "status": status, "scored_as": (answer or {}).get("languages")}
        )  # fmt: skip
    return out


def run(workdir: str, rows: int, out: Path) -> dict[str, Any]:
    from jaxtpu.core.serving.feedback import Store

    out.mkdir(parents=True, exist_ok=True)
    texts = comments(rows)
    want = predicted(workdir, texts, out)
    (out / "keys.txt").write_text(KEYS)
    store = out / "feedback.db"
    store.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "jaxtpu.serve", "--workdir", workdir, "--port", "0",
           "--api-keys", str(out / "keys.txt"), "--cors-origins", ORIGIN,
           "--feedback", str(store)]  # fmt: skip
    proc, url = _start(cmd, "serving")
    try:
        _wait_ready(url)
        card = _call(f"{url}/v1/model?key=coral-key", method="GET")[2]
        attrs = card["attributes"] if "attributes" in card else card["models"][0]["attributes"]
        columns = {a["name"]: a["column"] for a in attrs}
        endpoint = f"{url}/v1alpha1"  # Coral's endpoint setting; it joins the method to it
        calls = _coral(endpoint, texts, want, columns["TOXICITY"])
        statuses, batched = _batch(url, texts, list(columns))
        calls.append({"call": "batch (google-api-python-client)", "statuses": _count(statuses),
                      "max_abs_vs_predict": _diff(batched, want, columns)})  # fmt: skip
        calls += [*_page(endpoint, texts, want, columns), _quota(endpoint, texts[0])]
        detected = _languages(endpoint)
    finally:
        _stop(proc)
    kept = Store(str(store)).records()
    result = {"rows": rows, "version": card["version"], "calls": calls, "languages": detected,
              "feedback_rows": len(kept),
              "feedback_communities": sorted({r.community_id or "(none)" for r in kept}),
              "cpu": cpu_record()}  # fmt: skip
    (out / "clients.json").write_text(json.dumps(result, indent=1))
    return result


def _count(statuses: list[int]) -> dict[str, int]:
    return {str(s): statuses.count(s) for s in sorted(set(statuses))}


def _row(name: str, calls: list[tuple[int, Any, Any]], diff: float | None) -> dict[str, Any]:
    return {"call": name, "statuses": _count([c[0] for c in calls]), "max_abs_vs_predict": diff}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.clients", description=__doc__)
    p.add_argument("--workdir", required=True, help="a finished toxicity or multilabel run")
    p.add_argument("--rows", type=int, default=100, help="real comments (default: 100)")
    p.add_argument("--out", default="runs/serve-clients", help="where its files go")
    args = p.parse_args(argv)
    if not (Path(args.workdir) / "config.json").is_file():
        p.error(f"--workdir {args.workdir}: not a jaxtpu run directory (no config.json)")
    result = run(args.workdir, args.rows, Path(args.out))
    print(f"{args.rows} real comments; model version {result['version']}")
    print("| client and call | statuses | max abs vs jaxtpu predict |")
    print("|---|---|---|")
    for r in result["calls"]:
        diff = "" if r["max_abs_vs_predict"] is None else f"{r['max_abs_vs_predict']:.1e}"
        print(f"| {r['call']} | {r['statuses']} | {diff} |")
    communities = ", ".join(result["feedback_communities"])
    print(f"feedback kept: {result['feedback_rows']} rows ({communities})")
    print("| comment | detected | probability | sure | status | scored as |")
    print("|---|---|---|---|---|---|")
    for d in result["languages"]:
        print(f"| {d['text']} | {d['detected']} | {d['probability']} | {d['sure']} | "
              f"{d['status']} | {d['scored_as']} |")  # fmt: skip
    print(cpu_line(result["cpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
