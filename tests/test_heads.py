"""A community's head on the frozen served model (issue 96): the fit, its files, a directory of
them read again (`jaxtpu.core.serving.heads`), and `jaxtpu head` on a trained run."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np
import pytest
from helpers import cli

from jaxtpu.core.errors import DataError
from jaxtpu.core.metrics import roc_auc
from jaxtpu.core.serving import heads

SAMPLE = Path(__file__).parent.parent / "jaxtpu/core/data/sample/jigsaw_sample.csv"
COLUMNS = ("toxic", "insult")
RECORD = {"community": "c", "attribute": "TOXICITY", "column": "toxic", "columns": COLUMNS,
          "base_version": "jaxtpu-base"}  # fmt: skip


def _forum(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A forum whose moderators remove by a direction of the vector the base's score only
    half sees: (vectors, base probabilities, removed)."""
    rng = np.random.default_rng(seed)
    pooled = rng.normal(size=(n, 16))
    rule = pooled[:, 0] + 0.5 * pooled[:, 1]
    base = heads.sigmoid(np.stack([0.7 * pooled[:, 0] + rng.normal(size=n), pooled[:, 2]], 1))
    removed = (rule + 0.3 * rng.normal(size=n) > 1.0).astype(float)
    return pooled, base, removed


def test_a_head_learns_what_the_base_misses_and_the_strongest_is_the_bases_ranking():
    pooled, base, removed = _forum(600)
    tried = (1e-3, 0.03, 1.0, float("inf"))
    result = heads.fit(pooled[:400], base[:400], removed[:400], RECORD, strengths=tried)
    head, r = result.head, result.head.record
    assert r.decisions == 400 and r.removed == int(removed[:400].sum())
    assert r.strength != float("inf") and r.cv_auc > r.base_auc + 0.05
    assert set(result.tried) == set(tried) and r.cv_auc == round(max(result.tried.values()), 6)
    # on comments it never saw, better than the base
    new = head.probability(pooled[400:], base[400:])
    assert roc_auc(new, removed[400:]) > roc_auc(base[400:, 0], removed[400:]) + 0.05
    # the strongest regularisation is the base's own ranking (the bias alone)
    only = heads.fit(pooled, base, removed, RECORD, strengths=(float("inf"),)).head
    assert np.all(only.weights == 0)
    order = np.argsort(only.probability(pooled, base), kind="stable")
    assert np.array_equal(order, np.argsort(base[:, 0], kind="stable"))


def test_a_comment_unlike_every_decision_gets_no_correction_beyond_what_the_decisions_saw():
    """A queue brings its moderators the comments the base flags; a head learnt from those
    alone must not extrapolate its correction to comments far from them (issue 96: on the
    benchmark's flagged queue such a head ranked the unflagged comments above the flagged)."""
    pooled, base, removed = _forum(300)
    head = heads.fit(pooled, base, removed, RECORD, strengths=(1e-3,)).head
    seen = ((heads.inputs(pooled, base) - head.mean) / head.scale) @ head.weights
    assert (head.low, head.high) == (seen.min(), seen.max()) and head.base_weight >= 1.0
    far = np.concatenate([pooled[:2] * 50, -pooled[:2] * 50])
    x = heads.inputs(far, base[:4])
    raw = ((x - head.mean) / head.scale) @ head.weights
    assert ((raw < head.low) | (raw > head.high)).sum() == 2  # far beyond what decisions saw
    offset = x[:, far.shape[1]]
    want = head.base_weight * offset + np.clip(raw, head.low, head.high) + head.bias
    got = head.probability(far, base[:4])
    np.testing.assert_allclose(got, heads.sigmoid(want), rtol=1e-9, atol=1e-300)


def test_a_head_is_refused_decisions_of_one_class_in_one_line():
    pooled, base, _ = _forum(50)
    removed = np.zeros(50)
    removed[0] = 1
    with pytest.raises(DataError, match="1 removed and 49 kept: a head needs at least 2"):
        heads.fit(pooled, base, removed, RECORD)


def test_folds_hold_both_classes_and_every_decision_once():
    y = np.array([1] * 7 + [0] * 30)
    fold = heads.folds_of(y, 5)
    assert sorted(np.bincount(fold)) == [7, 7, 7, 8, 8]
    assert all(0 < y[fold == f].sum() < (fold == f).sum() for f in range(5))


def test_a_head_file_reads_back_exactly_and_a_broken_one_is_one_line(tmp_path):
    pooled, base, removed = _forum(200)
    head = heads.fit(pooled, base, removed, RECORD, strengths=(0.1,)).head
    path = tmp_path / heads.file_name("Coral:https://news.example/")
    assert path.name.startswith("Coral-https---news-example-") and path.suffixes[-2:] == [
        ".head",
        ".npz",
    ]
    version = heads.save(head, path)
    back = heads.load(path)
    assert back.version == version == heads.version_of(path.read_bytes())
    assert back.record == head.record and back.bias == head.bias
    np.testing.assert_array_equal(back.probability(pooled, base), head.probability(pooled, base))
    for data, why in ((b"not a zip", "not an .npz archive"), (b"PK\x03\x04cut", "not a head")):
        path.write_bytes(data)
        with pytest.raises(DataError, match=why):
            heads.load(path)
    np.savez(path, mean=np.zeros(3), scale=np.ones(3), weights=np.zeros(3), bias=np.array(0.0),
             record=np.array('{"format": 99}'))  # fmt: skip
    path.replace(path.with_suffix(".npz"))  # np.savez adds nothing to a name ending .npz
    with pytest.raises(DataError, match="a head of format 99; this jaxtpu reads 1"):
        heads.load(path)


def test_a_directory_of_heads_is_read_again_and_a_bad_file_never_replaces_a_good_one(tmp_path):
    pooled, base, removed = _forum(200)
    head = heads.fit(pooled, base, removed, RECORD, strengths=(0.1,)).head
    check = lambda h: "another base" if h.record.base_version != "jaxtpu-base" else None  # noqa: E731
    d = heads.HeadDir(tmp_path, check)
    assert d.refresh() == [] and d.heads == {}
    a = tmp_path / "a.head.npz"
    heads.save(head, a)
    (lines,) = [d.refresh()]
    assert len(lines) == 1 and "a.head.npz: added, community 'c'" in lines[0]
    assert d.heads["c"].version == heads.version_of(a.read_bytes())
    assert d.refresh() == []  # nothing changed: nothing read
    good = d.heads["c"]
    a.write_bytes(b"half a file")
    lines = d.refresh()
    assert "not a head file" in lines[0] and "the head it replaces keeps serving" in lines[0]
    assert d.heads["c"] is good
    other = heads.Head(
        heads.Record(**{**vars(head.record), "community": "d", "base_version": "x"}),
        head.mean, head.scale, head.weights, head.bias,
    )  # fmt: skip
    heads.save(other, tmp_path / "b.head.npz")
    refused = d.refresh()
    assert refused == [f"{tmp_path / 'b.head.npz'}: another base; not served"]
    assert set(d.heads) == {"c"}
    heads.save(head, tmp_path / "z.head.npz")  # a second file of community c
    lines = d.refresh()
    assert any("z.head.npz: community 'c' has a head in an earlier file" in x for x in lines)
    assert d.heads["c"] is good
    a.unlink()
    lines = d.refresh()
    assert "a.head.npz: removed" in lines[0]
    assert d.heads["c"].version == heads.version_of((tmp_path / "z.head.npz").read_bytes())
    with pytest.raises(DataError, match="not a directory"):
        heads.HeadDir(tmp_path / "none")


def _digest(run: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


@pytest.mark.e2e
@pytest.mark.model
def test_jaxtpu_head_fits_on_the_frozen_run_and_reads_each_comment_once(
    finished_run, tmp_path, capsys
):
    """Issue 96, item 1: `jaxtpu head` on a run's decisions writes a head the run's server
    accepts (its version), leaves every file of the run bitwise as it was, and scores a comment
    once (the second head reads the cache); the scores of a pooled pass are the run's own."""
    from jaxtpu import load
    from jaxtpu.serve.backends import load_served

    rows = list(csv.DictReader(SAMPLE.open()))[:120]
    decisions = tmp_path / "decisions.csv"
    with decisions.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["comment_text", "toxic", "community"])
        for i, r in enumerate(rows):
            w.writerow([r["comment_text"], "" if i == 5 else r["toxic"], "news"])
    before = _digest(finished_run)
    out = tmp_path / "heads"
    proc = cli("jaxtpu.serve.heads", "--workdir", finished_run, "--decisions", decisions,
               "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "scoring 119 comment(s)" in proc.stderr and "news: 119 decisions" in proc.stdout
    assert _digest(finished_run) == before
    (path,) = out.glob("*.head.npz")
    head = heads.load(path)
    served = load_served(str(finished_run), "workdir", "", "", 0, 8, None, pooled=True)
    assert head.record.base_version == served.version and head.record.community == "news"
    texts = [r["comment_text"] for r in rows[:9]]
    out_rows = served.probabilities(texts)
    k = len(served.columns)
    want = load(finished_run).predict(texts)
    np.testing.assert_allclose(out_rows[:, 0], want, rtol=0, atol=1e-6)
    assert out_rows.shape[1] > k
    assert np.all(np.isfinite(head.probability(out_rows[:, k:], out_rows[:, :k])))
    # the cache: every decision's comment is read, none scored again
    from jaxtpu.serve import heads as command

    texts = [r["comment_text"] for i, r in enumerate(rows) if i != 5]
    probs, vectors = command.encode(served, texts, out)
    assert "scoring" not in capsys.readouterr().err
    np.testing.assert_allclose(probs, served.probabilities(texts)[:, :k], rtol=0, atol=1e-6)
    with pytest.raises(SystemExit):
        command.main(["--workdir", str(finished_run), "--decisions", str(decisions),
                      "--out", str(out), "--attribute", "THREAT"])  # fmt: skip
    assert "--attribute THREAT: the run answers TOXICITY" in capsys.readouterr().err


def test_a_model_whose_head_gives_no_vector_says_so_in_one_line():
    """A --head hf model's classifier (transformers' own) sows no vector: a community's head
    or a readout asking for it is one line, not a KeyError from inside the trace."""
    from types import SimpleNamespace

    from jaxtpu.core.errors import UserError
    from jaxtpu.engine.steps import eval_step

    state = SimpleNamespace(params={}, apply_fn=lambda *a, **k: (np.zeros(2), {}))
    batch = {"input_ids": np.zeros((2, 4)), "attention_mask": np.ones((2, 4)), "label": np.zeros(2)}
    with pytest.raises(UserError, match=r"gives no vector .*\(--head jaxtpu\)"):
        eval_step(state, batch, loss=lambda s, y: s, pooled=True)
    assert set(eval_step(state, batch, loss=lambda s, y: s)) == {"score", "loss"}
