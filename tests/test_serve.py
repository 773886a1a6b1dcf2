"""`jaxtpu serve` over a real socket: a uvicorn server in this process answering for fake
models (a hash of the text as the score, no JAX), driven by Google's own API client and by raw
HTTP for each refusal, overload, a failing batch and slow clients; then one real server
process of a trained run, whose scores must be `jaxtpu.load().predict`'s."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from jaxtpu.core.serving.attributes import attribute_map
from jaxtpu.core.serving.card import model_version
from jaxtpu.core.tasks import get_task
from jaxtpu.core.textformat import TextFormat
from jaxtpu.serve.backends import Served

uvicorn = pytest.importorskip("uvicorn", reason="needs jaxtpu[serve] (uvicorn, starlette)")


def _score(text: str, column: int) -> float:
    digest = hashlib.sha256(f"{column}|{text}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32


class FakeModel(Served):
    """A `jaxtpu.serve.backends.Served` whose model scores by a hash of the text (its inputs
    and the mapping of scores to attributes are the real class's). A text holding FAIL fails
    its batch; `gate`, when set, holds every batch until opened."""

    def __init__(self, columns=("toxic", "insult"), rules="", source="--workdir fake"):
        task = dataclasses.replace(
            get_task("rules" if rules else "multilabel"), label_columns=columns
        )
        attributes = attribute_map(columns, bool(rules), rules)
        fmt = TextFormat("pair", "{rule}", rules=True) if rules else TextFormat()
        super().__init__(source, SimpleNamespace(task=task, text_format=fmt), attributes, ["en"])
        self._rule_text = {a.name: a.rule for a in attributes}
        self._columns = columns
        self.version = model_version({"fake": source})
        self.card = {"version": self.version, "attributes": [a.to_dict() for a in attributes]}
        self.gate: threading.Event | None = None
        self.calls: list[int] = []

    def probabilities(self, items):
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append(len(items))
        if any("FAIL" in (x if isinstance(x, str) else x[1]) for x in items):
            raise RuntimeError("this batch cannot be scored")
        if self.rules_model:
            return np.array([[_score(r + "|" + t, 0)] for r, t in items])
        return np.array([[_score(t, j) for j in range(len(self._columns))] for t in items])

    def warm_up(self):
        return 0


class Running:
    """A uvicorn server of `jaxtpu.serve.app` for `models`, in a thread, on a free port."""

    def __init__(self, models, **options):
        from jaxtpu.serve.app import Options, Server, build_app

        self.server = Server(models, Options(**options))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(build_app(self.server), log_level="error", lifespan="on")
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]})
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.ready:
            assert time.time() < deadline, "the server did not get ready"
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)


def post(url: str, body, key: str | None = "k1", headers=None):
    """(status, headers, JSON) of a POST to comments:analyze."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    q = f"?key={key}" if key else ""
    req = urllib.request.Request(f"{url}/v1alpha1/comments:analyze{q}", data, headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="module")
def served():
    """A multilabel-like model and a rules model side by side, keys required."""
    models = [
        FakeModel(),
        FakeModel(
            ("rule_violation",), 'NO_ADS="No ads",NO_LEGAL=No legal advice', "--workdir rules"
        ),
    ]
    running = Running(models, api_keys=frozenset({"k1"}), max_body=4096, read_timeout=1.0)
    yield running, models
    running.stop()


def test_perspectives_python_sample_works_against_the_server_unchanged(served):
    from googleapiclient import discovery

    running, (model, rules) = served
    client = discovery.build(
        "commentanalyzer",
        "v1alpha1",
        developerKey="k1",
        discoveryServiceUrl=f"{running.url}/$discovery/rest?version=v1alpha1",
        static_discovery=False,
    )
    body = {
        "comment": {"text": "What kind of idiot name is foo? Sorry, I like your name."},
        "requestedAttributes": {"TOXICITY": {}, "INSULT": {}, "NO_ADS": {}},
        "languages": ["en"],
        "spanAnnotations": True,
        "clientToken": "tok",
    }
    got = client.comments().analyze(body=body).execute()
    text = body["comment"]["text"]
    assert got["attributeScores"]["TOXICITY"]["summaryScore"] == {
        "value": _score(text, 0),
        "type": "PROBABILITY",
    }
    assert got["attributeScores"]["INSULT"]["summaryScore"]["value"] == _score(text, 1)
    assert got["attributeScores"]["NO_ADS"]["summaryScore"]["value"] == _score("No ads|" + text, 0)
    spans = got["attributeScores"]["TOXICITY"]["spanScores"]
    assert [(s["begin"], s["end"]) for s in spans] == [(0, 31), (32, 56)]
    assert spans[1]["score"]["value"] == _score("Sorry, I like your name.", 0)
    assert got["languages"] == ["en"] and got["clientToken"] == "tok"


def test_every_response_carries_the_version_and_the_other_routes_answer(served):
    running, models = served
    status, headers, body = post(
        running.url, {"comment": {"text": "hi"}, "requestedAttributes": {"TOXICITY": {}}}
    )
    assert status == 200 and headers["x-model-version"] == running.server.version
    assert running.server.version == model_version(
        {"model0": models[0].version, "model1": models[1].version}
    )
    status, headers, card = get(f"{running.url}/v1/model")
    assert status == 200 and [m["version"] for m in json.loads(card)["models"]] == [
        m.version for m in models
    ]
    assert get(f"{running.url}/healthz")[0] == 200
    assert json.loads(get(f"{running.url}/readyz")[2])["status"] == "ready"
    status, headers, page = get(f"{running.url}/")
    assert status == 200 and b"Comment scores" in page and "x-model-version" in headers
    status, _, metrics = get(f"{running.url}/metrics")
    assert status == 200 and b'jaxtpu_requests_total{code="200",route="analyze"}' in metrics


# (how the request is made, status, words in Google's error message)
HTTP_REFUSALS = [
    (dict(key=None), 403, "missing a valid API key"),
    (dict(key="nope"), 403, "API key not valid"),
    (dict(body=b"{"), 400, "Invalid JSON payload"),
    (dict(body={"comment": {"text": ""}, "requestedAttributes": {"TOXICITY": {}}}), 400, "empty"),
    (
        dict(body={"comment": {"text": "a"}, "requestedAttributes": {"SPAM": {}}}),
        400,
        "this model answers TOXICITY, INSULT, NO_ADS, NO_LEGAL",
    ),
    (dict(body=b"x" * 5000), 413, "limit is 4096"),
]


@pytest.mark.parametrize("how,code,words", HTTP_REFUSALS, ids=range(len(HTTP_REFUSALS)))
def test_refusals_over_http_are_googles_error_shape(served, how, code, words):
    running, _ = served
    body = how.get("body", {"comment": {"text": "a"}, "requestedAttributes": {"TOXICITY": {}}})
    status, headers, got = post(running.url, body, key=how.get("key", "k1"))
    assert status == code and words in got["error"]["message"], got
    assert set(got["error"]) >= {"code", "message", "status"} and got["error"]["code"] == code
    assert "x-model-version" in headers


def test_unknown_routes_and_methods_are_googles_error_shape(served):
    running, _ = served
    status, _, body = get(f"{running.url}/v1alpha1/comments:suggestscore")
    assert status == 404 and json.loads(body)["error"]["status"] == "NOT_FOUND"
    status, _, body = get(f"{running.url}/v1alpha1/comments:analyze")
    assert status == 405 and "not allowed" in json.loads(body)["error"]["message"]
    status, _, body = get(f"{running.url}/$discovery/rest?version=v1")
    assert status == 404 and "v1alpha1" in json.loads(body)["error"]["message"]


def _raw(port: int, data: bytes, wait: float = 0.0) -> bytes:
    """What the server answers to raw bytes (the client may go quiet for `wait` s first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        time.sleep(wait)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_huge_body_is_refused_before_it_is_read_and_a_slow_one_times_out(served):
    running, _ = served
    head = b"POST /v1alpha1/comments:analyze?key=k1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    t0 = time.perf_counter()
    answer = _raw(running.port, head + b"Content-Length: 1000000000\r\n\r\n")
    assert b" 413 " in answer.split(b"\r\n")[0] and time.perf_counter() - t0 < 5
    answer = _raw(running.port, head + b'Content-Length: 100\r\n\r\n{"comment":', wait=1.5)
    assert b" 408 " in answer.split(b"\r\n")[0] and b"DEADLINE_EXCEEDED" in answer
    # and the server still answers
    assert (
        post(running.url, {"comment": {"text": "a"}, "requestedAttributes": {"TOXICITY": {}}})[0]
        == 200
    )


def test_a_failing_batch_fails_its_own_requests_only(served):
    running, (model, _) = served
    ok = {"comment": {"text": "fine"}, "requestedAttributes": {"TOXICITY": {}}}
    bad = {"comment": {"text": "FAIL me"}, "requestedAttributes": {"TOXICITY": {}}}
    status, _, body = post(running.url, bad)
    assert status == 500 and body["error"]["status"] == "INTERNAL"
    status, _, body = post(running.url, ok)
    assert status == 200 and body["attributeScores"]["TOXICITY"]["summaryScore"]["value"] == _score(
        "fine", 0
    )


def test_concurrent_requests_are_batched_and_a_score_does_not_depend_on_its_batch(served):
    running, (model, _) = served
    texts = [f"comment number {i}" for i in range(40)]
    model.calls.clear()
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        answers = list(
            pool.map(
                lambda t: post(
                    running.url, {"comment": {"text": t}, "requestedAttributes": {"INSULT": {}}}
                ),
                texts,
            )
        )
    assert all(a[0] == 200 for a in answers)
    assert [a[2]["attributeScores"]["INSULT"]["summaryScore"]["value"] for a in answers] == [
        _score(t, 1) for t in texts
    ]
    assert len(model.calls) < len(texts) and max(model.calls) > 1  # batched


def test_a_flood_beyond_the_queue_gets_429_with_retry_after_and_the_server_recovers():
    model = FakeModel()
    model.gate = threading.Event()
    running = Running([model], max_queue=2, max_items=1, max_wait_ms=0)
    try:
        body = {"comment": {"text": "x"}, "requestedAttributes": {"TOXICITY": {}}}
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(post, running.url, body, None) for _ in range(12)]
            time.sleep(1.0)
            model.gate.set()
            answers = [f.result() for f in futures]
        codes = sorted(a[0] for a in answers)
        assert codes.count(200) >= 1 and codes.count(429) >= 1, codes
        refused = next(a for a in answers if a[0] == 429)
        assert (
            int(refused[1]["retry-after"]) >= 1
            and refused[2]["error"]["status"] == "RESOURCE_EXHAUSTED"
        )
        assert post(running.url, body, None)[0] == 200
    finally:
        model.gate.set()
        running.stop()


# --------------------------------------------------------------------------- a real model


@pytest.mark.e2e
@pytest.mark.model
def test_a_served_run_scores_as_jaxtpu_load_and_stops_cleanly_on_sigterm(finished_run, tmp_path):
    """The tiny run `finished_run` served by `python -m jaxtpu.serve` (a real process):
    Google's client gets, for real comments, the probabilities `jaxtpu.load().predict` gives
    (within 1e-6), alone or in a crowd; SIGTERM finishes and exits 0."""
    import signal
    import subprocess
    import sys

    import jaxtpu
    from parity_tests.harness import ROOT, clean_env

    texts = [
        "you are an idiot",
        "thanks for the edit!",
        "What kind of idiot name is foo?",
        "I   like\n\nyour   work",
        "\U0001f600 nice",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxtpu.serve", "--workdir", str(finished_run), "--port", "0"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("serving http://"):
                url = line.split()[1].split("/v1alpha1")[0]
                break
        assert url, proc.stderr.read()
        deadline = time.time() + 120
        while get(f"{url}/readyz")[0] != 200:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.2)
        want = jaxtpu.load(finished_run, num_devices=1).predict(texts)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            crowd = list(
                pool.map(
                    lambda t: post(
                        url, {"comment": {"text": t}, "requestedAttributes": {"TOXICITY": {}}}, None
                    ),
                    texts * 3,
                )
            )
        got = [a[2]["attributeScores"]["TOXICITY"]["summaryScore"]["value"] for a in crowd]
        np.testing.assert_allclose(got, np.tile(want, 3), atol=1e-6, rtol=0)
        alone = post(
            url, {"comment": {"text": texts[0]}, "requestedAttributes": {"TOXICITY": {}}}, None
        )
        assert alone[2]["attributeScores"]["TOXICITY"]["summaryScore"]["value"] == got[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "stopped" in proc.stdout.read()
        assert not any(t in proc.stderr.read() for t in ("idiot", "thanks"))  # no text logged
    finally:
        if proc.poll() is None:
            proc.kill()


def _start_server(*flags: str):
    """`python -m jaxtpu.serve FLAGS --port 0` as a real process: (process, its base URL),
    once it says where it serves."""
    import subprocess
    import sys

    from parity_tests.harness import ROOT, clean_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxtpu.serve", *flags, "--port", "0"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("serving http://"):
            return proc, line.split()[1].split("/v1alpha1")[0]
    raise AssertionError(proc.stderr.read())


def _children(pid: int) -> list[int]:
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.e2e
@pytest.mark.model
def test_an_onnx_export_served_by_two_workers_scores_as_its_graph(onnx_export, tmp_path):
    """Issue 65: `jaxtpu serve --onnx DIR --workers 2` (two processes accepting on one socket,
    uvicorn's supervisor): every answer is the graph's own logit (onnxruntime on the whole
    --max-len, no buckets) through the export's recorded calibration, within 1e-6; a comment
    gets the same score bitwise from either worker and in any batch; the int8 graph is another
    version; SIGTERM stops both and the parent exits 0. Bad --onnx paths are one line."""
    import signal

    import onnxruntime as ort

    from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
    from jaxtpu.core.errors import UserError
    from jaxtpu.serve.onnxmodel import OnnxModel

    out = onnx_export.out
    meta = json.loads((out / "jaxtpu_onnx.json").read_text())
    texts = ["you are an idiot", "thanks for the edit!", "What kind of   idiot name is foo?"]
    ids, mask = encode_texts(texts, load_tokenizer(out), meta["max_len"])
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    z = ort.InferenceSession(str(out / "model.onnx")).run(None, feeds)[0][:, 0]
    cal = meta["calibration"]
    want = 1 / (1 + np.exp(-(z * cal["scale"][0] + cal["shift"][0])))

    proc, url = _start_server("--onnx", str(out), "--workers", "2")
    try:
        deadline = time.time() + 120
        while get(f"{url}/readyz")[0] != 200:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.2)
        body = lambda t: {"comment": {"text": t}, "requestedAttributes": {"TOXICITY": {}}}  # noqa: E731
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            crowd = list(pool.map(lambda t: post(url, body(t), None), texts * 8))
        assert {c[0] for c in crowd} == {200}, crowd[0]
        got = np.array(
            [c[2]["attributeScores"]["TOXICITY"]["summaryScore"]["value"] for c in crowd]
        )
        np.testing.assert_allclose(got, np.tile(want, 8), atol=1e-6, rtol=0)
        assert all(len(set(got[i :: len(texts)])) == 1 for i in range(len(texts)))  # bitwise
        assert len(_children(proc.pid)) >= 2  # the workers (and multiprocessing's tracker)
        version = crowd[0][1]["x-model-version"]
        assert {c[1]["x-model-version"] for c in crowd} == {version}  # both workers' the same
        assert json.loads(get(f"{url}/v1/model")[2])["version"] == version  # one model's card
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()

    fp32, int8 = OnnxModel(out, 4), OnnxModel(out / "model_int8.onnx", 4)
    assert fp32.trained.weights_digest() != int8.trained.weights_digest()
    assert np.abs(int8.predict(texts) - want).max() < 0.05
    with pytest.raises(UserError, match="not a jaxtpu ONNX export"):
        OnnxModel(tmp_path, 4)
    (tmp_path / "jaxtpu_onnx.json").write_text(json.dumps({**meta, "files": {"fp32": "a.onnx"}}))
    with pytest.raises(UserError, match="the export lists a.onnx, not model.onnx"):
        OnnxModel(tmp_path / "model.onnx", 4)


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.e2e
def test_the_page_shows_each_attributes_score_as_a_bar_in_a_real_browser(served, tmp_path):
    """Headless Chromium (Debian's: `apt-get install chromium`) opens `/?text=...`, which
    scores the comment through the API: the page's bars are the model's scores."""
    import os
    import re
    import subprocess

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM}: apt-get install chromium (Debian's package) to run it")
    running, (model, _) = served
    text = "You are an idiot."
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=10000", "--dump-dom",
         f"{running.url}/?text={urllib.request.quote(text)}&key=k1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dom = proc.stdout
    rows = re.findall(
        r'data-attribute="([A-Z_]+)".*?width: ([0-9.]+)%.*?class="value">([0-9.]+)<', dom
    )
    assert [r[0] for r in rows] == ["TOXICITY", "INSULT", "NO_ADS", "NO_LEGAL"], dom[-2000:]
    want = {"TOXICITY": _score(text, 0), "INSULT": _score(text, 1)}
    for name, width, value in rows[:2]:
        assert float(value) == pytest.approx(want[name], abs=5e-4)
        assert float(width) == pytest.approx(100 * want[name], abs=0.05)
    assert running.server.version in dom
