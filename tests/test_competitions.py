"""Every Jigsaw competition as it is: Unintended Bias (`target`, identity columns, its bias
metric), Multilingual (`lang`, `content`), `jaxtpu.evaluate` and the Python API.

The competitions' own files are not here: files of their layouts are built from the real
comments of ../shared/data, with fractions, identities and languages assigned in the test. The
bias metric is checked against a reference written below from the competition's definition
(sklearn and numpy only, no code shared with `jaxtpu.core.metrics`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from jaxtpu.core import metrics
from jaxtpu.core.data import readers, records, templates, tokenized
from jaxtpu.core.data.filekinds import kind_of
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.tasks import TASKS, get_task, higher_is_better
from parity_tests.competitions import IDENTITIES, real_rows, write_bias_file, write_language_file

IDS = IDENTITIES


# --------------------------------------------------------------------------- the reference


def reference_bias(scores, target, identities: dict[str, np.ndarray]) -> tuple[float, list[str]]:
    """The Unintended Bias metric as the competition's benchmark code computed it: labels and
    identities binarised with `np.where(col >= 0.5, True, False)` (so a blank identity value
    is outside the subgroup, in its background), 0.25 overall AUC + 0.25 x the power mean
    (p = -5) of subgroup, BPSN and BNSP AUC over the identities; a subgroup where one of the
    three is undefined is left out (where that code's NaN would make the whole score NaN)."""
    y = np.where(np.asarray(target) >= 0.5, True, False)
    per: dict[str, list[float]] = {"sub": [], "bpsn": [], "bnsp": []}
    skipped = []
    for name, values in identities.items():
        sub = np.where(np.asarray(values) >= 0.5, True, False)
        bg = ~sub
        sets = {
            "sub": sub,
            "bpsn": (sub & ~y) | (bg & y),
            "bnsp": (sub & y) | (bg & ~y),
        }
        if any(len(set(y[m].tolist())) < 2 for m in sets.values()):
            skipped.append(name)
            continue
        for k, m in sets.items():
            per[k].append(roc_auc_score(y[m], scores[m]))
    total = 0.25 * roc_auc_score(y, scores)
    for values in per.values():
        total += 0.25 * np.power(np.mean(np.power(values, -5.0)), -1 / 5.0)
    return float(total), skipped


def test_bias_metric_matches_its_definition():
    rng = np.random.default_rng(0)
    n = 400
    target = rng.choice([0.0, 0.1, 0.3, 0.5, 0.7, 1.0], n)
    scores = target + rng.normal(0, 0.4, n)
    identities = {
        "male": rng.choice([0.0, 0.2, 0.6, 1.0], n),
        "female": np.where(rng.random(n) < 0.4, np.nan, rng.choice([0.0, 0.8], n)),
        "muslim": np.where(target >= 0.5, rng.choice([0.0, 1.0], n), 0.0),  # only toxic members
        "jewish": np.full(n, np.nan),
    }
    identities["jewish"][:5] = 0.0  # five known rows, none in the subgroup
    parts, left_out = metrics.jigsaw_bias(scores, target, identities)
    want, skipped = reference_bias(scores, target, identities)
    assert sorted(left_out) == sorted(skipped) == ["jewish", "muslim"]
    assert parts["jigsaw_bias"] == pytest.approx(want, abs=1e-12)
    assert parts["overall_auc"] == pytest.approx(roc_auc_score(target >= 0.5, scores))
    assert "subgroup_auc_male" in parts and "subgroup_auc_muslim" not in parts
    # Pad rows (weight 0) are not scored.
    padded = metrics.jigsaw_bias(
        np.r_[scores, 9.0],
        np.r_[target, 0.0],
        {k: np.r_[v, 1.0] for k, v in identities.items()},
        np.r_[np.ones(n), 0.0],
    )[0]
    assert padded["jigsaw_bias"] == pytest.approx(want, abs=1e-12)


def test_a_blank_identity_value_is_in_the_background_as_the_competition_counted_it():
    # Rows: a subgroup negative (0.5), a subgroup positive (0.6), background negative and
    # positive (0.2, 0.9), and a positive whose identity cell is blank (0.1).
    y = np.array([0, 1, 0, 1, 1], float)
    g = np.array([1, 1, 0, 0, np.nan])
    s = np.array([0.5, 0.6, 0.2, 0.9, 0.1])
    parts = metrics.jigsaw_bias(s, y, {"g": g})[0]
    # BPSN: subgroup negatives {0.5} against background positives {0.9, 0.1}: one of two
    # pairs ranked right (0.5 if the blank row counted; 1.0 if it were left out).
    assert parts["bpsn_auc_g"] == 0.5
    # BNSP: subgroup positives {0.6} against background negatives {0.2}: 1.0 either way.
    assert parts["bnsp_auc_g"] == 1.0 and parts["subgroup_auc_g"] == 1.0


def test_bias_metric_of_a_perfect_and_a_biased_model():
    y = np.array([0, 0, 0, 0, 1, 1, 1, 1], float)
    g = np.array([0, 0, 1, 1, 0, 0, 1, 1], float)
    perfect = metrics.jigsaw_bias(y, y, {"g": g})[0]
    assert perfect["jigsaw_bias"] == 1.0
    # Scores that rank every subgroup comment above every background one: subgroup AUC 1,
    # BPSN 0 (subgroup negatives above background positives), BNSP 1.
    biased = metrics.jigsaw_bias(y + 2 * g, y, {"g": g})[0]
    assert (biased["subgroup_auc"], biased["bpsn_auc"], biased["bnsp_auc"]) == (1.0, 0.0, 1.0)


def test_language_aucs():
    rng = np.random.default_rng(1)
    langs = rng.choice(["es", "it", "tr"], 300)
    y = rng.integers(0, 2, 300).astype(float)
    s = y + rng.normal(0, 1.0, 300)
    y[langs == "tr"] = 1.0  # one class: no AUC
    parts, left_out = metrics.language_aucs(s, y, langs)
    assert left_out == ["tr"]
    for lang in ("es", "it"):
        m = langs == lang
        assert parts[f"auc_{lang}"] == pytest.approx(roc_auc_score(y[m], s[m]))
    assert parts["mean_language_auc"] == pytest.approx((parts["auc_es"] + parts["auc_it"]) / 2)


# --------------------------------------------------------------------------- the files


def test_readers_of_each_competition_layout(real_csv, tmp_path):
    bias = readers.read_comments(write_bias_file(real_csv, tmp_path / "train.csv", 60, 0, 0))
    assert np.isclose(bias.labels[:, None], [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]).any(1).all()
    assert np.unique(bias.labels).size > 2  # fractions kept as soft targets
    assert list(bias.groups.identities) == list(IDS) and bias.groups.lang is None
    blank = np.isnan(bias.groups.identities["male"])
    assert 0 < blank.sum() < 60
    assert np.array_equal(blank, np.isnan(bias.groups.identities["female"]))
    sub = bias.subset(np.arange(10, 20))
    assert np.array_equal(
        sub.groups.identities["muslim"], bias.groups.identities["muslim"][10:20], equal_nan=True
    )

    valid = readers.read_comments(
        write_language_file(real_csv, tmp_path / "validation.csv", 50, 0, 1)
    )
    assert set(valid.groups.lang.tolist()) == {"es", "it", "tr"} and not valid.groups.identities
    test = write_language_file(real_csv, tmp_path / "test.csv", 20, 0, 1, labelled=False)
    assert kind_of(readers.columns(test)).name == "unlabelled"
    to_score = readers.read_comments(test, labelled=False)
    assert to_score.texts[0] == templates.normalize_text(real_rows(real_csv, 1)[0]["comment_text"])
    assert to_score.ids[:2] == ["0", "1"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("id,comment_text,target\n1,a,1.5\n", "line 2: target=1.5 is outside [0, 1]"),
        ("comment_text,target,male\na,0.1,\nb,0.9,\n", "identity column male is blank in all 2"),
        ("comment_text,toxic,target\na,1,0.9\n", "has both toxic and target columns"),
        ("comment_text,content,toxic\na,b,1\n", "has both comment_text and content columns"),
        ("comment_text,lang,toxic\na,es,1\nb,,0\n", "line 3: lang is blank"),
        ("less_toxic,more_toxic,lang\na,b,es\n", "a lang column goes with a classification"),
    ],
)
def test_bad_competition_files_get_one_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    read = readers.read_pairs if text.startswith("less") else readers.read_comments
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read(path)


def test_monitors_follow_the_file():
    tox, rank = get_task("toxicity"), get_task("ranking")
    bias = records.Groups({"male": np.zeros(3)})
    langs = records.Groups(lang=np.array(["es", "it", "es"]))
    assert tox.monitors() == ("val_auc", "val_loss")
    assert tox.monitors(bias) == ("val_jigsaw_bias", "val_auc", "val_loss")
    assert tox.monitors(langs) == ("val_auc", "val_mean_language_auc", "val_loss")
    assert rank.monitors(bias) == ("val_agreement", "val_loss")
    assert tox.choose_monitor("", bias) == "val_jigsaw_bias"
    assert tox.choose_monitor("val_mean_language_auc", langs) == "val_mean_language_auc"
    with pytest.raises(ConfigError, match="--monitor val_mean_language_auc: the toxicity task"):
        tox.choose_monitor("val_mean_language_auc", bias)
    assert not higher_is_better("val_loss") and higher_is_better("val_jigsaw_bias")


def test_evaluate_names_the_metric_of_the_files_kind():
    from jaxtpu.engine.evaluation import METRICS, headline

    def ex(groups=None):
        groups = groups or records.Groups()
        return tokenized.Examples(np.zeros((1, 4)), np.zeros((1, 4)), np.zeros(1), groups=groups)

    bias = records.Groups({"male": np.zeros(1)})
    langs = records.Groups(lang=np.array(["es"]))
    assert headline(get_task("toxicity"), ex()) == "auc"
    assert headline(get_task("toxicity"), ex(bias)) == "jigsaw_bias"
    assert headline(get_task("toxicity"), ex(langs)) == "auc"  # the leaderboard's, as trained
    for task in TASKS.values():  # evaluate's headline is what a run monitors by default
        for groups in (None, bias, langs):
            expected = task.monitors(groups)[0]
            assert METRICS[headline(task, ex(groups))] == expected
    assert headline(get_task("multilabel"), ex()) == "mean_column_auc"
    assert headline(get_task("ranking"), ex()) == "agreement"


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def bias_run(real_csv, tmp_path_factory):
    """A tiny fp32 toxicity run on Unintended Bias files, monitoring the bias metric."""
    from jaxtpu import train
    from jaxtpu.core.flags import presets

    d = tmp_path_factory.mktemp("bias")
    cfg = presets.tiny().replace(
        train_csv=str(write_bias_file(real_csv, d / "train.csv", 320, 0, 0)),
        valid_csv=str(write_bias_file(real_csv, d / "valid.csv", 160, 2000, 1)),
        precision="fp32",
        epochs=2,
        workdir=str(d / "run"),
    )
    summary = train.train_and_evaluate(cfg)
    return d, summary


@pytest.mark.model
def test_unintended_bias_trains_monitors_and_evaluates_its_metric(bias_run, real_csv, tmp_path):
    from jaxtpu.engine import checkpoint
    from jaxtpu.evaluate import main

    d, summary = bias_run
    assert summary["monitor"] == "val_jigsaw_bias"
    evals = [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e.get("event") == "eval"]
    assert len(evals) == 2
    for key in ("val_jigsaw_bias", "val_overall_auc", "val_bpsn_auc", "val_bnsp_auc_muslim"):
        assert np.isfinite(evals[-1][key]), key
    best = checkpoint.Checkpoints(d / "run").best_meta()

    out = tmp_path / "m.json"
    args = ["--workdir", str(d / "run"), "--input", str(d / "valid.csv"), "--out", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["metric"] == "jigsaw_bias" and report["examples"] == 160
    # The same number training recorded for its best checkpoint on the same file.
    assert report["value"] == pytest.approx(best["val_jigsaw_bias"], abs=1e-5)
    assert report["subgroup_auc_male"] == pytest.approx(best["val_subgroup_auc_male"], abs=1e-5)

    langs = write_language_file(real_csv, tmp_path / "validation.csv", 90, 3000, 2)
    assert (
        main(
            ["--workdir", str(d / "run"), "--input", str(langs), "--out", str(tmp_path / "l.json")]
        )
        == 0
    )
    report = json.loads((tmp_path / "l.json").read_text())
    assert report["metric"] == "auc"  # the leaderboard's; each language's beside it
    assert {"auc_lang_es", "auc_lang_it", "auc_lang_tr", "mean_language_auc"} <= set(report)


@pytest.mark.model
def test_evaluate_refuses_a_file_of_another_kind(bias_run, tmp_path, capsys):
    from jaxtpu.evaluate import main

    d, _ = bias_run
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("less_toxic,more_toxic\nthanks,idiot\n")
    with pytest.raises(SystemExit) as e:
        main(["--workdir", str(d / "run"), "--input", str(pairs)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "a toxicity run is evaluated on labelled comments" in err and "a pairs file" in err


@pytest.mark.model
def test_python_api_scores_texts_and_compiles_each_length_once(bias_run, tmp_path):
    import jaxtpu
    from jaxtpu import predict

    d, _ = bias_run
    model = jaxtpu.load(d / "run", num_devices=2, batch_size=2)
    texts = ["thanks for the edit", "you are an idiot " * 4, "ok"]
    probs = model.predict(texts)
    assert probs.shape == (3,) and ((probs > 0) & (probs < 1)).all()
    # The same scores as the predict command writes.
    src = tmp_path / "in.csv"
    src.write_text("comment_text\n" + "".join(f"{t}\n" for t in texts))
    argv = ["--workdir", str(d / "run"), "--input", str(src), "--output", str(tmp_path / "o.csv")]
    assert predict.main([*argv, "--num-devices", "2"]) == 0
    written = np.loadtxt(tmp_path / "o.csv", delimiter=",", skiprows=1)[:, 1]
    assert np.allclose(probs, written, atol=1e-6)
    eval_fn = model.backend.strategy._eval  # the jitted eval step, compiled per batch shape
    compiled = eval_fn._cache_size()
    model.predict(["another short one", "and a longer comment " * 3, "x"])  # same lengths
    assert eval_fn._cache_size() == compiled
    assert model.predict([]).shape == (0,)


@pytest.mark.model
def test_a_killed_predict_resumes_to_the_same_file(
    bias_run, real_csv, tmp_path, monkeypatch, capsys
):
    """Predict reads, scores and writes in chunks; killed after its second chunk (and after
    writing rows it had not recorded yet), `--resume` writes the uninterrupted run's bytes."""
    from jaxtpu import predict

    d, _ = bias_run
    src = write_language_file(real_csv, tmp_path / "test.csv", 45, 500, 0, labelled=False)
    out = tmp_path / "new" / "sub.csv"  # its directory is made
    common = [
        "--workdir",
        str(d / "run"),
        "--input",
        str(src),
        "--num-devices",
        "2",
        "--chunk-rows",
        "16",
    ]
    assert predict.main([*common, "--output", str(tmp_path / "whole.csv")]) == 0
    whole = (tmp_path / "whole.csv").read_bytes()
    assert whole.count(b"\n") == 46 and whole.startswith(b"id,toxic\r\n0,")

    from jaxtpu.engine import predictions

    save, calls = predictions.Progress.save, []

    def killed_after_two(self, rows, size, digest, *written):
        save(self, rows, size, digest, *written)
        calls.append(rows)
        if len(calls) == 2:
            with open(self.partial, "ab") as f:
                f.write(b"33,0.5\r\n" * 99 + b"34,0.")  # written, not recorded: killed mid-chunk
            raise KeyboardInterrupt

    monkeypatch.setattr(predictions.Progress, "save", killed_after_two)
    with pytest.raises(SystemExit) as e:  # Ctrl-C: exit 130
        predict.main([*common, "--output", str(out)])
    assert e.value.code == 130
    capsys.readouterr()
    monkeypatch.setattr(predictions.Progress, "save", save)
    assert calls == [16, 32] and not out.exists()
    for extra, message in [
        ([], "stopped after 32 rows; pass --resume to continue it or --overwrite"),
        (["--resume", "--batch-size", "3"], "--resume: the stopped predict into"),
    ]:
        with pytest.raises(SystemExit) as e:
            predict.main([*common, "--output", str(out), *extra])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert predict.main([*common, "--output", str(out), "--resume"]) == 0
    assert out.read_bytes() == whole
    assert not list(out.parent.glob(".sub.csv*"))  # no partial file or record left


def test_a_validation_set_where_the_monitored_breakdown_is_undefined_is_refused(tmp_path):
    """Every identity subgroup (or every language) holding one class: the bias metric (or the
    mean language AUC) is NaN at every evaluation, so no best model would ever be kept."""
    import dataclasses

    from helpers import fake_examples

    from jaxtpu.core.data import records, taskdata
    from jaxtpu.core.flags.presets import tiny
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.run import plan

    valid = fake_examples(16)  # labels 0, 1, 0, 1, ...: both classes overall
    y = valid.label
    one_class = {"male": np.where(y == 1, 1.0, 0.0), "female": np.where(y == 1, 1.0, np.nan)}
    cases = [
        ("", records.Groups(identities=one_class), "every identity subgroup (male, female)"),
        (
            "val_mean_language_auc",
            records.Groups(lang=np.where(y == 1, "es", "it")),
            "every language (es, it) holds one class",
        ),
    ]

    def job(cfg, data):
        return plan.Job(
            cfg, RunSpec.resolve(cfg), data, plan.Plan.make(cfg, data.train, 1), tmp_path, 0
        )

    for monitor, groups, why in cases:
        cfg = tiny().replace(workdir=str(tmp_path), monitor=monitor, num_devices=1)
        data = taskdata.TaskData(
            fake_examples(56), dataclasses.replace(valid, groups=groups), {"split": "f.csv"}
        )
        with pytest.raises(DataError, match="undefined at every evaluation") as e:
            plan.Job(
                cfg, RunSpec.resolve(cfg), data, plan.Plan.make(cfg, data.train, 1), tmp_path, 0
            )
        assert why in str(e.value) and "--monitor val_auc" in str(e.value)
    # One subgroup with both classes is enough: the metric is defined.
    defined = {**one_class, "muslim": (np.arange(16) % 3 == 0).astype(np.float64)}
    data = taskdata.TaskData(
        fake_examples(56), dataclasses.replace(valid, groups=records.Groups(defined)), {}
    )
    cfg = tiny().replace(workdir=str(tmp_path), num_devices=1)
    assert job(cfg, data).monitor == "val_jigsaw_bias"


def test_a_rules_validation_set_of_one_class_rules_advises_what_would_help(tmp_path):
    """The advice is not the monitor the run already uses (val_mean_rule_auc is the rules
    task's own): the overall AUC, or a validation set that holds both classes."""
    import dataclasses

    from helpers import fake_examples

    from jaxtpu.core.data import records, taskdata
    from jaxtpu.core.flags.presets import tiny
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.run import plan

    valid = fake_examples(16)
    y = np.asarray(valid.label)
    rules = records.Groups(rule=np.where(y == 1, "No ads", "No legal advice").astype(object))
    cfg = tiny().replace(workdir=str(tmp_path), task="rules", num_devices=1)
    data = taskdata.TaskData(fake_examples(56), dataclasses.replace(valid, groups=rules), {})
    with pytest.raises(DataError, match="every rule .* holds one class") as e:
        plan.Job(cfg, RunSpec.resolve(cfg), data, plan.Plan.make(cfg, data.train, 1), tmp_path, 0)
    message = str(e.value)
    assert "--monitor val_auc," in message and "--holdout-rules N" in message
    assert "--monitor val_mean_rule_auc" not in message


def test_groups_describe_take_and_say_which_breakdowns_a_file_has():
    """`Groups` reads the breakdown table (`core/breakdowns.py`) for what it holds: its
    description in the log, its rows taken alike, and whether it holds any."""
    import numpy as np

    from jaxtpu.core.data.records import Groups

    groups = Groups(
        {"male": np.array([1.0, np.nan, 0.0]), "female": np.zeros(3)},
        np.array(["es", "it", "es"]),
        np.array(["No ads.", "No spam.", "No ads."], dtype=object),
    )
    assert groups.describe() == "identities male, female; languages es, it; 2 rules"
    taken = groups.take(np.array([2, 0]))
    assert taken.lang.tolist() == ["es", "es"] and taken.rule.tolist() == ["No ads."] * 2
    assert taken.identities["male"].tolist() == [0.0, 1.0] and set(taken.identities) == {
        "male",
        "female",
    }
    assert Groups(lang=np.array(["en"])).describe() == "languages en"
    assert groups and not Groups() and Groups().describe() == ""
