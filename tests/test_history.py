"""`jaxtpu history` (issue 94): a platform's Perspective history read from Coral Talk's real
export formats (mongodump's BSON written by pymongo's own encoder, mongoexport's Extended JSON
in both its modes) and from any table; Perspective's scale fitted by isotonic regression
(checked against scikit-learn's) and kept in a run's calibration; the comparison a platform
reads before switching. No JAX here but the last test, which maps a tiny run."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
import warnings

import numpy as np
import pytest

from jaxtpu.core import calibration
from jaxtpu.core.data.history import scale
from jaxtpu.core.data.history.rows import read_history
from jaxtpu.core.errors import DataError, UserError

bson = pytest.importorskip("bson", reason="needs pymongo's bson codec (jaxtpu[serve])")
from bson import json_util  # noqa: E402

WHEN = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)


def _revision(rid, body, score=None, model="TOXICITY", minutes=0):
    meta = {} if score is None else {"perspective": {"score": score, "model": model}}
    return {"id": rid, "body": body, "metadata": meta, "actionCounts": {},
            "createdAt": WHEN + dt.timedelta(minutes=minutes), "status": "NONE"}  # fmt: skip


def _comment(cid, *revisions, site="site-1"):
    return {"_id": bson.ObjectId(), "id": cid, "tenantID": "tenant-a", "siteID": site,
            "storyID": "story-1", "authorID": "u", "revisions": list(revisions),
            "status": "NONE", "createdAt": WHEN}  # fmt: skip


def _action(cid, rid, status, moderator="mod-1", minutes=5):
    when = WHEN + dt.timedelta(minutes=minutes)
    return {"_id": bson.ObjectId(), "id": f"a-{cid}-{minutes}", "tenantID": "tenant-a",
            "commentID": cid, "commentRevisionID": rid, "storyID": "story-1", "status": status,
            "moderatorID": moderator, "createdAt": when}  # fmt: skip


COMMENTS = [
    # edited: the latest revision's text and score; rejected, approved, rejected again
    _comment(
        "c1",
        _revision("r1a", "<p>first draft</p>", 0.2),
        _revision("r1b", "<p>You are an <b>idiot</b> &amp; a fool</p>", 0.91, minutes=1),
    ),
    _comment("c2", _revision("r2", "Thanks for the <a href='x'>link</a>!<br>Very useful.", 0.03)),
    _comment("c3", _revision("r3", "", None)),  # a deleted account: body emptied
    _comment("c4", _revision("r4", "never scored, but rejected", None)),  # fmt: skip
    _comment("c5", _revision("r5", "never scored nor decided", None)),
    _comment(
        "c6", _revision("r6", "scored by the older default", 0.55, "SEVERE_TOXICITY"), site="site-2"
    ),
]
ACTIONS = [
    _action("c1", "r1b", "REJECTED", minutes=5),
    _action("c1", "r1b", "APPROVED", minutes=6),
    _action("c1", "r1b", "REJECTED", minutes=7),  # the moderator ended here
    _action("c1", "r1a", "APPROVED", minutes=8),  # an older revision's: not this text's
    _action("c2", "r2", "APPROVED"),
    _action("c3", "r3", "REJECTED", moderator=None),  # the system's, for the deleted account
    _action("c4", "r4", "REJECTED"),
    _action("c6", "r6", "NONE"),  # no decision
]


def _export(tmp_path, kind):
    """COMMENTS and ACTIONS as `kind`: mongodump's BSON, or mongoexport's JSON lines in relaxed
    or canonical Extended JSON."""
    paths = []
    for name, docs in (("comments", COMMENTS), ("commentModerationActions", ACTIONS)):
        if kind == "bson":
            path = tmp_path / f"{name}.bson"
            path.write_bytes(b"".join(bson.encode(d) for d in docs))
        else:
            mode = json_util.RELAXED_JSON_OPTIONS if kind == "relaxed" else (
                json_util.CANONICAL_JSON_OPTIONS)  # fmt: skip
            path = tmp_path / f"{name}.json"
            path.write_text("".join(json_util.dumps(d, json_options=mode) + "\n" for d in docs))
        paths.append(path)
    return paths


@pytest.mark.parametrize("kind", ["bson", "relaxed", "canonical"])
def test_coral_exports_are_read_as_its_readers_saw_them_and_its_moderators_decided(tmp_path, kind):
    from jaxtpu.core.data.history.coral import read_coral

    comments, actions = _export(tmp_path, kind)
    if kind == "canonical":
        assert '"$numberDouble": "0.91"' in comments.read_text()  # the canonical form indeed
    history = read_coral(comments, actions)
    got = {r.id: r for r in history.rows}
    assert set(got) == {"c1", "c2", "c4", "c6"}
    assert got["c1"].text == "You are an idiot & a fool" and got["c1"].scores == {"TOXICITY": 0.91}
    assert got["c1"].decision == 1.0 and got["c1"].community == "tenant-a/site-1"
    assert got["c1"].time == "2025-03-01T12:01:00+00:00"
    assert got["c2"].text == "Thanks for the link! Very useful." and got["c2"].decision == 0.0
    assert got["c4"].scores == {} and got["c4"].decision == 1.0
    assert got["c6"].scores == {"SEVERE_TOXICITY": 0.55} and got["c6"].decision is None
    assert got["c6"].model == "SEVERE_TOXICITY" and got["c6"].community == "tenant-a/site-2"
    assert history.attributes == ["TOXICITY", "SEVERE_TOXICITY"]
    assert sum(history.left_out.values()) == 2  # the deleted account's, the one never scored


def test_a_coral_file_of_another_collection_or_format_is_one_line(tmp_path):
    from jaxtpu.core.data.history.coral import read_coral

    comments, actions = _export(tmp_path, "relaxed")
    with pytest.raises(DataError, match="not a document of Coral's comments collection"):
        read_coral(actions, None)
    with pytest.raises(DataError, match="commentModerationActions collection"):
        read_coral(comments, comments)
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", "revisions": [\n')
    with pytest.raises(DataError, match="not mongoexport's Extended JSON"):
        read_coral(bad, None)
    broken = tmp_path / "broken.bson"
    broken.write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(DataError, match="not a mongodump BSON file"):
        read_coral(broken, None)
    unscored = tmp_path / "unscored.json"
    unscored.write_text(json_util.dumps(_comment("z", _revision("rz", "hi", None))) + "\n")
    with pytest.raises(DataError, match="no comment with a score or a decision"):
        read_coral(unscored, None)


def test_any_table_with_perspective_columns_is_read_and_bad_scores_are_refused(tmp_path):
    good = tmp_path / "scored.csv"
    good.write_text("id,text,toxicity,Insult,decision\n1,hello,0.1,,\n2,you idiot,0.9,0.8,1\n"
                    "3,,0.5,,\n4,nothing here,,,\n")  # fmt: skip
    history = read_history(good)
    assert [r.id for r in history.rows] == ["1", "2"]
    assert history.rows[1].scores == {"TOXICITY": 0.9, "INSULT": 0.8}
    assert history.rows[1].decision == 1.0 and history.attributes == ["TOXICITY", "INSULT"]
    assert history.left_out == {"with an empty text": 1, "with neither a score nor a decision": 1}
    for text, words in [
        ("comment_text,TOXICITY\na,1.5\n", "TOXICITY='1.5' is not a Perspective score"),
        ("comment_text,score\na,0.5\n", "Perspective's scores as columns named by attribute"),
        ("comment_text,TOXICITY,decision\na,0.5,REJECTED\n", "is not a moderator's decision"),
    ]:
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(DataError, match=words):
            read_history(bad)


def test_import_writes_the_history_whole_and_its_decisions_join_the_feedback_store(
    tmp_path, capsys
):
    from jaxtpu.core.serving.feedback import Store
    from jaxtpu.history import main

    comments, actions = _export(tmp_path, "bson")
    out, store = tmp_path / "history.csv", tmp_path / "feedback.db"
    argv = ["import", "--comments", str(comments), "--actions", str(actions), "--out", str(out)]
    assert main([*argv, "--feedback", str(store)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["id", "comment_text", "TOXICITY", "SEVERE_TOXICITY",
                             "perspective_model", "decision", "community", "time"]  # fmt: skip
    assert {r["id"]: r["decision"] for r in rows} == {"c1": "1", "c2": "0", "c4": "1", "c6": ""}
    assert read_history(out).rows[0].scores == {"TOXICITY": 0.91}  # read back as written
    kept = {r.client_token: r for r in Store(str(store)).records()}
    assert set(kept) == {"comment:c1", "comment:c2", "comment:c4"}
    assert kept["comment:c1"].attribute_scores == {"DELETED": {"summaryScore": 1.0}}
    assert kept["comment:c1"].moderator and kept["comment:c1"].owner == "history-import"
    assert "4 comments" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # exists
        main(argv)
    assert "pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the wrong collection: nothing written
        main(["import", "--comments", str(actions), "--out", str(tmp_path / "no.csv")])
    assert not (tmp_path / "no.csv").exists()


def test_isotonic_blocks_are_scikit_learns_fit():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(0)
    x = rng.random(500)
    y = np.clip(x**2 + rng.normal(0, 0.1, 500), 0, 1)
    bx, by, n = scale.isotonic(x, y)
    ours = np.repeat(by, n.astype(int))
    theirs = IsotonicRegression().fit_transform(x, y)[np.argsort(x)]
    np.testing.assert_allclose(ours, theirs, atol=1e-12)
    assert (np.diff(bx) > 0).all() and (np.diff(by) > 0).all()


def test_the_scale_is_strictly_increasing_and_moves_thresholds_not_ranks():
    """A model whose scores are compressed under Perspective's (the issue: nothing reached
    0.8) is mapped onto it: flags at 0.8 match, the rank correlation is the model's own."""
    rng = np.random.default_rng(1)
    theirs = rng.beta(0.5, 2, 3000)
    p = 0.6 * np.sqrt(theirs) + rng.normal(0, 0.02, 3000)  # never above 0.8
    before = scale.compare({"T": theirs}, {"T": p})["T"]
    assert before["above"]["0.8"]["jaxtpu"] == 0 < before["above"]["0.8"]["perspective"]
    ratios = {}
    for method in scale.METHODS:
        xs, ys = scale.fit(p, theirs, method)
        assert (np.diff(xs) > 0).all() and (np.diff(ys) > 0).all() and ys[0] >= 0 and ys[-1] <= 1
        after = scale.compare({"T": theirs}, {"T": scale.apply(p, xs, ys)})["T"]
        assert after["rank_correlation"] == pytest.approx(before["rank_correlation"], abs=1e-12)
        ratios[method] = {t: after["above"][t]["jaxtpu"] / after["above"][t]["perspective"]
                          for t in ("0.8", "0.9")}  # fmt: skip
        assert 0.75 < ratios[method]["0.8"] < 1.25 and after["above"]["0.8"]["f1"] > 0.7
    # the quantile map passes as many comments as Perspective did; the isotonic map's mean
    # regresses to the middle, fewer
    assert abs(ratios["quantile"]["0.9"] - 1) < abs(ratios["isotonic"]["0.9"] - 1)
    with pytest.raises(ValueError):
        scale.fit(p[:10], theirs[:10])
    with pytest.raises(ValueError, match="one of quantile, isotonic"):
        scale.fit(p, theirs, "linear")


def test_compare_counts_strictly_above_each_threshold_and_the_f1():
    theirs = {"TOXICITY": np.array([0.95, 0.85, 0.8, 0.1, np.nan]), "INSULT": np.array([0.5] * 5)}
    ours = {"TOXICITY": np.array([0.9, 0.6, 0.81, 0.2, 0.99])}
    r = scale.compare(theirs, ours)
    assert set(r) == {"TOXICITY"} and r["TOXICITY"]["comments"] == 4  # the unscored left out
    at = r["TOXICITY"]["above"]["0.8"]  # Perspective: 0.95, 0.85 (0.8 is not above); jaxtpu:
    assert (at["perspective"], at["jaxtpu"], at["both"]) == (2, 2, 1)  # 0.9 and 0.81
    assert at["f1"] == pytest.approx(0.5)
    assert r["TOXICITY"]["mean_difference"] == pytest.approx((-0.05 - 0.25 + 0.01 + 0.1) / 4)
    assert "| TOXICITY | 4 |" in scale.table(r)


def test_a_calibration_carries_the_scale_applies_it_and_refuses_a_broken_one():
    dates = ("2025-01-01", "2025-02-01")
    m = calibration.PerspectiveScale(
        "toxic", "TOXICITY", (0.0, 0.5, 1.0), (0.0, 0.9, 1.0), 100, "h.csv", dates, ("TOXICITY",)
    )
    cal = calibration.Calibration(("toxic", "insult"), (1.0, 1.0), (0.0, 0.0), perspective=(m,))
    z = np.array([[0.0, 0.0], [2.0, -1.0]])
    p = calibration.sigmoid(cal.apply(z))
    assert p[0, 0] == pytest.approx(0.9) and p[0, 1] == pytest.approx(0.5)
    assert p[1, 0] == pytest.approx(np.interp(calibration.sigmoid(2.0), m.x, m.y))
    again = calibration.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())), "f")
    assert again == cal and cal.subset(["insult"]).perspective == ()
    assert "toxic as TOXICITY (100 comments)" in cal.describe()
    broken = cal.to_dict()
    broken["perspective"][0]["x"] = [0.5, 0.2, 1.0]
    with pytest.raises(UserError, match="not an increasing map"):
        calibration.Calibration.from_dict(broken, "f")
    from jaxtpu.core.serving.card import NO_SCALE, perspective_scale

    attrs = [{"name": "TOXICITY", "column": "toxic"}, {"name": "INSULT", "column": "insult"}]
    shown = perspective_scale(attrs, cal.to_dict())
    assert shown["TOXICITY"]["rows"] == 100 and shown["INSULT"] == NO_SCALE


def _vectors_and_scores(n=400, hidden=16, seed=0):
    """Vectors and Perspective scores that are a noisy logistic function of one direction of
    them (what a readout can learn and a monotone map of another score cannot)."""
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, hidden))
    w = rng.normal(size=hidden)
    return v, calibration.sigmoid(v @ w / 2 + rng.normal(scale=0.3, size=n) - 1.0)


def test_a_readout_learns_the_scores_from_the_vector_and_predicts_each_row_out_of_fold():
    from scipy.stats import spearmanr

    from jaxtpu.core.data.history import readout

    v, y = _vectors_and_scores()
    y[:40] = np.nan  # unscored: left out
    r = readout.fit(v, y)
    known = np.isfinite(y)
    assert np.isnan(r.held_out[:40]).all() and np.isfinite(r.held_out[known]).all()
    assert r.rank_correlation == pytest.approx(spearmanr(r.held_out[known], y[known]).statistic)
    assert r.rank_correlation > 0.9 and r.l2 in readout.L2_GRID
    fitted = v @ r.weights + r.bias
    assert spearmanr(fitted[known], y[known]).statistic > 0.9
    # held out: each row predicted by the folds that did not see it, not by the final fit
    assert not np.allclose(fitted[known], r.held_out[known], atol=1e-3)
    # its logit units: the fit's mean predicted score is near the scores' own
    assert abs(calibration.sigmoid(fitted[known]).mean() - y[known].mean()) < 0.05
    with warnings.catch_warnings():  # unscored rows' NaN, as fit-scale maps them, is quiet
        warnings.simplefilter("error")
        assert np.isnan(calibration.sigmoid(r.held_out[:40])).all()
    with pytest.raises(ValueError, match="99 scored rows"):
        readout.fit(v[:99], y[40:139])
    with pytest.raises(ValueError, match="1 distinct"):
        readout.fit(v, np.full(len(v), 0.2))


def test_a_calibration_reads_a_column_out_of_the_vector_maps_it_and_needs_the_vector():
    rng = np.random.default_rng(1)
    w, pooled = rng.normal(size=4), rng.normal(size=(5, 4))
    r = calibration.Readout("toxic", "TOXICITY", tuple(w), 0.5, 300, 10.0)
    m = calibration.PerspectiveScale("toxic", "TOXICITY", (0.0, 0.5, 1.0), (0.0, 0.8, 1.0), 300)
    cal = calibration.Calibration(("toxic", "insult"), (2.0, 2.0), (0.0, 1.0))
    cal = cal.with_perspective((m,), (r,))
    assert cal.needs_pooled and not calibration.Calibration(("a",), (1.0,), (0.0,)).needs_pooled
    z = rng.normal(size=(5, 2))
    got = calibration.sigmoid(cal.apply(z, pooled))
    want = np.interp(calibration.sigmoid(pooled @ w + 0.5), m.x, m.y)  # not the model's toxic
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-9)
    np.testing.assert_allclose(got[:, 1], calibration.sigmoid(2 * z[:, 1] + 1), rtol=1e-9)
    with pytest.raises(UserError, match="out of the model's vector .* given none"):
        cal.apply(z)
    with pytest.raises(UserError, match=r"given shape \(5, 3\)"):
        cal.apply(z, pooled[:, :3])
    again = calibration.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())), "f")
    assert again == cal
    assert cal.subset(["insult"]).readouts == () and cal.subset(["toxic"]).readouts == (r,)
    assert cal.with_perspective((m,)).readouts == ()  # mapped again from the model's own
    assert "toxic as TOXICITY (300 comments, read out of the vector)" in cal.describe()
    broken = cal.to_dict()
    broken["readouts"][0]["weights"] = [float("nan")] * 4
    with pytest.raises(UserError, match="non-finite weights"):
        calibration.Calibration.from_dict(broken, "f")
    from jaxtpu.core.serving.card import perspective_scale

    shown = perspective_scale([{"name": "TOXICITY", "column": "toxic"}], cal.to_dict())
    assert shown["TOXICITY"]["readout"] == {"rows": 300, "l2": 10.0}


def test_a_texts_ngrams_are_lowercased_words_and_padded_characters_of_unit_norm():
    from jaxtpu.core import ngrams

    f = ngrams.features("Go AWAY go")
    assert {"w go", "w away", "w go away", "w away go", "c go", "c go ", "caway "} <= set(f)
    assert f["w go"] > f["w away"] and "c goaway" not in f  # counted twice; words apart
    assert sum(v * v for v in f.values()) == pytest.approx(1.0)
    assert ngrams.features("") == {}
    third = 3**-0.5  # " ! " padded: two 2-grams and one 3-gram, once each; no word
    assert ngrams.features("!") == pytest.approx({"c !": third, "c! ": third, "c ! ": third})
    bomb = "ab " * 20_000  # only the first MAX_CHARS characters are read
    assert ngrams.counts(bomb)["w ab"] == ngrams.MAX_CHARS // 3  # and an "a", not a word
    assert ngrams.text_of(("rule", "comment")) == "rule comment"
    # in all four texts: the n-grams of "away", first in order; "go" is in three only
    assert ngrams.vocabulary([f, f, f, ngrams.features("away")], size=2) == ["c a", "c aw"]
    assert "w go" not in ngrams.vocabulary([f, f, ngrams.features("away")], least=3)


def test_a_readout_of_the_texts_ngrams_learns_a_word_the_vector_does_not_hold():
    """Scores set by one word of the text, vectors of noise: the vector alone cannot read the
    score, the vector and the n-grams can (held out), and a calibration built from the fit
    applies it from the texts, which it then needs."""
    from scipy.stats import spearmanr

    from jaxtpu.core import ngrams
    from jaxtpu.core.data.history import readout

    rng = np.random.default_rng(0)
    words = ["page", "edit", "source", "thanks", "hello", "talk", "article", "zork"]
    texts = [" ".join(rng.choice(words, 6)) for _ in range(400)]
    marked = np.array([t.split().count("zork") for t in texts])
    y = calibration.sigmoid(2.0 * marked - 1.5 + rng.normal(scale=0.3, size=400))
    v = rng.normal(size=(400, 8))
    each = [ngrams.features(t) for t in texts]
    alone, read = readout.fit(v, y), readout.fit(v, y, grams=each)
    assert alone.rank_correlation < 0.3 < 0.8 < read.rank_correlation
    # the weightiest n-gram is one of "zork"'s (no other word has a z)
    assert read.l2 in readout.NGRAM_L2_GRID and "z" in max(read.grams, key=read.grams.get)
    r = calibration.Readout("toxic", "TOXICITY", tuple(read.weights), read.bias, 400, read.l2,
                            read.grams)  # fmt: skip
    cal = calibration.Calibration(("toxic",), (1.0,), (0.0,)).with_perspective(
        (calibration.PerspectiveScale("toxic", "TOXICITY", (0.0, 1.0), (0.0, 1.0), 400),), (r,)
    )
    assert cal.needs_texts and cal.needs_pooled
    got = cal.apply(np.zeros((400, 1)), v, texts)[:, 0]
    words = [sum(x * read.grams.get(g, 0.0) for g, x in f.items()) for f in each]
    want = v @ read.weights + read.bias + np.array(words)
    np.testing.assert_allclose(calibration.sigmoid(got), calibration.sigmoid(want), atol=1e-6)
    assert spearmanr(got, y).statistic > 0.8
    with pytest.raises(UserError, match="out of the texts' n-grams but was given no texts for 400"):
        cal.apply(np.zeros((400, 1)), v)
    again = calibration.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())), "f")
    assert again == cal and "and " in cal.describe() and " n-grams)" in cal.describe()
    from jaxtpu.core.serving.card import perspective_scale

    shown = perspective_scale([{"name": "TOXICITY", "column": "toxic"}], cal.to_dict())
    assert shown["TOXICITY"]["readout"]["ngrams"] == len(read.grams) > 0


@pytest.mark.parametrize("where", ["jax", "onnx"])
def test_each_scorer_hands_its_calibration_the_texts_it_scored(where):
    """`scores_of` (every scorer's `scores`) gives the texts to the scorer's own `calibrate`,
    which passes them to a calibration that reads their n-grams: the JAX scorer's and the
    ONNX one's (the slim server's), each called on a stand-in holding only what they read."""
    if where == "jax":
        from jaxtpu.engine.scoring import Scorer as cls
    else:
        pytest.importorskip("onnxruntime", reason="the ONNX scorer needs onnxruntime")
        from jaxtpu.serve.onnxmodel import OnnxScorer as cls
    from jaxtpu.engine.scoring import scores_of

    r = calibration.Readout("toxic", "TOXICITY", (0.0, 0.0), 0.0, 100, 1.0, {"w zork": 5.0})
    cal = calibration.Calibration(("toxic",), (1.0,), (0.0,), readouts=(r,))

    class Scoring:
        calibration = cal
        calibrate = cls.calibrate

        def features(self, texts):
            return np.zeros(len(texts)), np.zeros((len(texts), 2))

    got = scores_of(Scoring(), ["zork here", "nothing"])
    assert got[0] == pytest.approx(5.0 * ngrams_value("zork here", "w zork")) and got[1] == 0.0


def ngrams_value(text, gram):
    from jaxtpu.core import ngrams

    return ngrams.features(text)[gram]


def test_history_touches_no_jax_until_it_scores(monkeypatch):
    import importlib
    import sys

    for name in [
        m for m in sys.modules if m.startswith(("jaxtpu.history", "jaxtpu.core.data.history"))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jax", None)  # importing it fails
    importlib.import_module("jaxtpu.history")
    importlib.import_module("jaxtpu.core.data.history.coral")


@pytest.mark.e2e
@pytest.mark.model
def test_fit_scale_maps_a_run_onto_the_historys_scale_and_compare_says_so(
    finished_run, tmp_path, capsys
):
    """The tiny run's TOXICITY mapped onto a history whose scores are a monotone function of
    its own (so the map can reach them): after fit-scale, predict gives Perspective's scale
    (flags at 0.5 as the history's), the run's training comments are left out, and compare
    prints both ways."""
    from jaxtpu import load
    from jaxtpu.history import main

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    texts = [f"comment number {i} about {w}" for i, w in enumerate(["edits", "you idiot"] * 40)]
    raw = load(run, num_devices=1).predict(texts)
    order = np.argsort(np.argsort(raw))
    theirs = (order + 0.5) / len(texts)  # Perspective's: the ranks of the run's own scores
    history = tmp_path / "h.csv"
    with history.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["comment_text", "TOXICITY"])
        w.writerows(zip(texts, theirs, strict=True))
    assert main(["fit-scale", "--workdir", str(run), "--history", str(history)]) == 0
    out = capsys.readouterr().out
    assert "TOXICITY: mapped onto Perspective's scale on 80 comments" in out
    cal = calibration.read(run)
    assert [m.attribute for m in cal.perspective] == ["TOXICITY"]
    mapped = load(run, num_devices=1).predict(texts)
    assert abs(int((mapped > 0.5).sum()) - int((theirs > 0.5).sum())) <= 2
    assert np.array_equal(np.argsort(mapped, kind="stable"), np.argsort(raw, kind="stable"))
    report = tmp_path / "r.json"
    assert main(["compare", "--workdir", str(run), "--history", str(history), "--report",
                 str(report)]) == 0  # fmt: skip
    assert "on Perspective's scale: TOXICITY" in capsys.readouterr().out
    assert json.loads(report.read_text())["TOXICITY"]["comments"] == 80
    assert main(["compare", "--workdir", str(run), "--history", str(history), "--raw"]) == 0
    assert "(raw)" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.torch  # the ONNX export
def test_fit_scale_readout_ranks_as_the_history_and_every_scorer_applies_it(
    finished_run, tmp_path, capsys
):
    """A history whose TOXICITY follows a direction of the run's vector that its own output
    does not rank by: after fit-scale --readout, predict ranks as the history does (it did
    not before), compare and the card say so, and an ONNX export made after it ranks so
    too."""
    from jaxtpu import export, load
    from jaxtpu.core.serving.card import perspective_scale
    from jaxtpu.core.serving.shadow import spearman
    from jaxtpu.history import main
    from jaxtpu.serve.onnxmodel import OnnxModel

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    rng = np.random.default_rng(0)
    words = ["edits", "idiot", "page", "thanks", "stupid", "source", "hello", "you"]
    texts = [" ".join(rng.choice(words, 5)) + f" {i}" for i in range(160)]
    before = load(run, num_devices=1, pooled=True)
    raw, vectors = before.scored(texts)
    # of the vectors' five main directions, the one the run's own score follows least
    centred = vectors - vectors.mean(0)
    components = np.linalg.svd(centred, full_matrices=False)[2][:5]
    x = min((centred @ c for c in components), key=lambda p: abs(np.corrcoef(p, raw[:, 0])[0, 1]))
    theirs = calibration.sigmoid(3 * x / x.std())

    def rho(a, b):
        return spearman(list(zip(a, b, strict=True)))

    assert rho(raw[:, 0], theirs) < 0.8
    history = tmp_path / "h.csv"
    with history.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["comment_text", "TOXICITY"])
        w.writerows(zip(texts, theirs, strict=True))
    argv = ["fit-scale", "--workdir", str(run), "--history", str(history), "--readout"]
    assert main(argv) == 0
    assert "TOXICITY: mapped onto Perspective's scale on 160 comments" in capsys.readouterr().out
    cal = calibration.read(run)
    assert [r.attribute for r in cal.readouts] == ["TOXICITY"]
    after = load(run, num_devices=1).predict(texts)
    assert rho(after, theirs) > 0.95
    shown = perspective_scale([{"name": "TOXICITY", "column": "toxic"}], cal.to_dict())
    assert shown["TOXICITY"]["readout"]["rows"] == 160
    assert main(["compare", "--workdir", str(run), "--history", str(history)]) == 0
    assert "read out of the model's vector: TOXICITY" in capsys.readouterr().out
    out = tmp_path / "onnx"
    assert export.main(["--workdir", str(run), "--out", str(out), "--format", "onnx"]) == 0
    # the export's graph runs in fp32 where this run scores in bf16: its vectors differ by
    # about 1e-3, which the readout of a minor direction of a 7-step model magnifies; what
    # must hold is that the export reads the attribute out as the run does
    assert rho(OnnxModel(out, 8).predict(texts), theirs) > 0.9
    # --ngrams: the vector and the texts' n-grams, which predict and compare then read
    assert main([*argv, "--ngrams"]) == 0
    assert "n-grams of the text (L2" in capsys.readouterr().out
    assert calibration.read(run).needs_texts
    assert rho(load(run, num_devices=1).predict(texts), theirs) > 0.9
    assert main(["compare", "--workdir", str(run), "--history", str(history)]) == 0
    said = capsys.readouterr().out
    assert "read out of the model's vector and the text's n-grams: TOXICITY" in said, said


def _history_file(path, n=150, seed=0):
    """`n` comments with Perspective's TOXICITY, INSULT and FLIRTATION (blank on some rows)
    and Jigsaw's toxic label on every third row only."""
    rng = np.random.default_rng(seed)
    words = ["thanks", "idiot", "edit", "stupid", "lovely", "page", "moron", "source"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", "TOXICITY", "INSULT", "FLIRTATION"])
        for i in range(n):
            text = " ".join(rng.choice(words, 6))
            tox = sum(t in text for t in ("idiot", "stupid", "moron")) / 3
            insult = "" if i % 5 == 0 else round(tox * 0.8, 3)
            label = "" if i % 3 else int(tox > 0.3)
            w.writerow([i, f"{text} {i}", label, round(tox, 3), insult, round(rng.random() / 5, 3)])
    return path


def test_perspective_takes_the_files_attribute_columns_as_targets_answered_by_name(tmp_path):
    from jaxtpu.core.data import perspective
    from jaxtpu.core.errors import ConfigError
    from jaxtpu.core.flags.presets import get_preset

    path = _history_file(tmp_path / "h.csv", n=20)
    cfg = get_preset("tiny").replace(perspective=True, train_csv=str(path), task="multilabel")
    got = perspective.resolve(cfg)
    assert got.train.aux_columns == "TOXICITY,INSULT,FLIRTATION"
    served = dict(item.split("=") for item in got.output.attributes.split(","))
    # learnt columns by their own names; Jigsaw's labels where no learnt column takes the name
    assert served["TOXICITY"] == "TOXICITY" and served["FLIRTATION"] == "FLIRTATION"
    assert "toxic" not in served and "insult" not in served and served["obscene"] == "PROFANITY"
    assert perspective.resolve(got) == got  # resolved once
    jigsaw = tmp_path / "j.csv"
    jigsaw.write_text("comment_text,toxic,insult,threat\na,1,1,0\n")  # lower case: labels
    for bad, words in [
        (cfg.replace(train_csv=str(jigsaw)), "no column named by a Perspective attribute"),
        (cfg.replace(task="ranking"), "does not score one comment"),
        (cfg.replace(aux_columns="INSULT"), "not with --aux-columns INSULT"),
        (cfg.replace(n_folds=5), "does not go with --n-folds"),
    ]:
        with pytest.raises(ConfigError, match=words):
            perspective.resolve(bad)


@pytest.mark.e2e
@pytest.mark.model
def test_a_run_learns_perspectives_scores_answers_them_and_is_mapped_on_held_out_rows(
    tmp_path, capsys
):
    """train --perspective on a history file (toxic blank on two rows of three): the run's
    rows are written to WORKDIR/perspective/ (toxic from TOXICITY where blank), the model
    answers TOXICITY, INSULT and FLIRTATION from what it learnt, and fit-scale fits on the
    held-out rows alone."""
    from helpers import TINY, cli

    from jaxtpu import load
    from jaxtpu.engine.scoring import run_attributes
    from jaxtpu.history import main

    history, run = _history_file(tmp_path / "h.csv"), tmp_path / "run"
    proc = cli("jaxtpu.train", *TINY, "--train-csv", history, "--perspective",
               "--valid-fraction", "0.4", "--workdir", run, "--max-steps", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader((run / "perspective" / "train.csv").open()))
    valid = list(csv.DictReader((run / "perspective" / "valid.csv").open()))
    assert len(rows) + len(valid) == 150 and len(valid) == 60
    assert all(r["toxic"] for r in rows) and any(r["toxic"] == r["TOXICITY"] for r in rows)
    # the run ends on Perspective's scale, fitted on the 60 rows it held out
    ended = calibration.read(run).perspective
    insults = sum(bool(r["INSULT"]) for r in valid)  # blank on every fifth row
    assert [(m.attribute, m.rows) for m in ended] == [("TOXICITY", 60), ("INSULT", insults),
                                                       ("FLIRTATION", 60)]  # fmt: skip
    assert ended[0].source == "valid.csv (held out)"
    attributes, _ = run_attributes(run)
    assert {a.name: a.column for a in attributes}["FLIRTATION"] == "FLIRTATION"
    out = load(run, num_devices=1).predict(["you idiot", "thanks"], all_outputs=True)
    assert {"TOXICITY", "INSULT", "FLIRTATION"} <= set(out)
    assert main(["fit-scale", "--workdir", str(run), "--history", str(history)]) == 0
    printed = capsys.readouterr()
    assert "left out: 90 comment(s) of the run's training rows" in printed.err
    assert "TOXICITY: mapped onto Perspective's scale on 60 comments" in printed.out
    from jaxtpu.export import main as export_main

    assert export_main(["--workdir", str(run), "--out", str(tmp_path / "hf")]) == 0
    head = json.loads((tmp_path / "hf" / "jaxtpu_head.json").read_text())
    assert "FLIRTATION" in json.dumps(head)  # the learnt attributes are exported, unasked
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    scales = config[calibration.CONFIG_KEY]["perspective"]
    assert [m["attribute"] for m in scales] == ["TOXICITY", "INSULT", "FLIRTATION"]  # with it
