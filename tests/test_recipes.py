"""The notebook as written (issue 27): the file's own folds, folds of pairs that keep every
comment on one side, folds stratified over the six labels, the notebooks' `.sample(n=...)`,
and the `lr` a metrics line reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxtpu.core.data import demo, pairing, readers, records, splits, taskdata, tokenized
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags import presets
from jaxtpu.core.tasks import LABELS


def _fold_file(tmp_path, folds, name="train_5folds.csv"):
    path = tmp_path / name
    rows = [f"{i},comment number {i},{i % 3 == 0:d},{f}" for i, f in enumerate(folds)]
    path.write_text("id,comment_text,toxic,kfold\n" + "\n".join(rows) + "\n")
    return path


def test_the_files_fold_column_is_the_split(tmp_path):
    from jaxtpu.core.data.tokens import load_tokenizer

    folds = np.arange(60) % 5
    cfg = presets.tiny().replace(
        train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold", fold=3, max_len=8
    )
    data = taskdata.load_task_data(cfg, load_tokenizer(cfg_tokenizer()))
    assert len(data.valid) == 12 and len(data.train) == 48
    assert np.array_equal(data.valid_rows, np.flatnonzero(folds == 3))
    assert "fold 3 of the file's kfold (5 folds)" in data.info["split"]


def cfg_tokenizer() -> str:
    from jaxtpu.core.hf.encoder import packaged_minilm_dir

    return packaged_minilm_dir()


@pytest.mark.parametrize(
    "folds, flags, message",
    [
        ([0] * 20, {"fold": 0}, "every row of .* is in fold 0; k-fold needs at least two folds"),
        ([0, 1] * 10, {"fold": 4}, "--fold 4: no row of .* has kfold = 4; its folds are 0, 1"),
        (["x"] * 20, {"fold": 0}, r"line 2: kfold='x' is not a fold number"),
    ],
)
def test_bad_fold_columns_are_one_line(tmp_path, folds, flags, message):
    cfg = presets.tiny().replace(
        train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold", max_len=8, **flags
    )
    with pytest.raises(DataError, match=message):
        taskdata.load_task_data(cfg, None)


def test_a_fold_column_with_n_folds_is_refused():
    with pytest.raises(ConfigError, match="--fold-column kfold takes the folds from the file"):
        presets.tiny().replace(fold_column="kfold", n_folds=5)


def test_pair_folds_keep_every_comment_on_one_side():
    rng = np.random.default_rng(0)
    # 40 small groups of pairs that share comments, and one group too large for a fold
    less, more = [], []
    for g in range(40):
        texts = [f"g{g}c{i}" for i in range(3)]
        less += [texts[0], texts[1]]
        more += [texts[1], texts[2]]
    big = [f"big{i}" for i in range(30)]
    for _ in range(60):
        a, b = rng.choice(30, 2, replace=False)
        less.append(big[a])
        more.append(big[b])
    pairs = records.Pairs("p", less, more)
    groups = pairing.comment_groups(pairs)
    assert np.unique(groups).size == 41
    for fold in range(5):
        train, valid, lost = splits.pair_split(pairs, 0.1, 0, n_folds=5, fold=fold)
        seen = {t for i in train for t in (pairs.less[i], pairs.more[i])}
        held = {t for i in valid for t in (pairs.less[i], pairs.more[i])}
        assert not seen & held
        assert train.size + valid.size + lost == len(pairs)
        assert 0 < lost < 60  # only pairs of the large group can straddle
    # the small groups are whole: each group's pairs sit in one fold
    less_f, more_f = pairing.pair_folds(pairs, 5, 0)
    small = [g for g in np.unique(groups) if (groups == g).sum() == 2]
    assert len(small) == 40
    for g in small:
        assert len(set(less_f[groups == g]) | set(more_f[groups == g])) == 1


def test_multilabel_folds_are_stratified_over_the_labels():
    rng = np.random.default_rng(1)
    n = 500
    labels = (rng.random(n) < 0.3).astype(np.float32)
    subs = (rng.random((n, 5)) < [0.05, 0.2, 0.02, 0.2, 0.1]).astype(np.float32)
    c = records.Comments("c", [f"t{i}" for i in range(n)], labels, subs)
    folds = splits.fold_assignment(c, 5, seed=0, label_columns=LABELS)
    y = tokenized.labels_of(c, LABELS)
    for j in range(6):
        per_fold = [y[folds == f, j].sum() for f in range(5)]
        assert max(per_fold) - min(per_fold) <= 2, (LABELS[j], per_fold)


def test_subsample_is_seeded_stratified_and_of_the_asked_size():
    rng = np.random.default_rng(2)
    labels = (rng.random(1000) < 0.25).astype(np.float32)
    c = records.Comments("c", [f"t{i}" for i in range(1000)], labels)
    a = splits.subsample(c, 400, 0, ("toxic",))
    assert a.size == 400 and np.unique(a).size == 400
    assert np.array_equal(a, splits.subsample(c, 400, 0, ("toxic",)))
    assert not np.array_equal(a, splits.subsample(c, 400, 1, ("toxic",)))
    assert labels[a].sum() == round(400 * labels.mean())


def test_the_lr_of_a_metrics_line_is_the_rate_its_step_trained_with(tmp_path):
    """A linear schedule over 7 updates: step s trained at lr x (7 - (s - 1)) / 7."""
    from helpers import FakeBackend, run_fake

    run_fake(tmp_path, FakeBackend({}), epochs=1, schedule="linear", lr=1e-3)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = {x["step"]: x["lr"] for x in lines if x["event"] == "train"}
    assert lrs[1] == pytest.approx(1e-3)
    for step, lr in lrs.items():
        assert lr == pytest.approx(1e-3 * (7 - (step - 1)) / 7, rel=1e-6), step


@pytest.mark.model
def test_all_folds_train_each_fold_and_write_their_record_and_oof(tmp_path):
    """--all-folds: three tiny folds, each in its own run directory; folds.json has each
    fold's best value, their mean and spread; oof.csv has every row once, predicted by the
    fold that held it out; --resume keeps finished folds; predict averages the folds."""
    from jaxtpu import predict, train

    base = tmp_path / "cv"
    argv = [
        "--preset",
        "tiny",
        "--n-folds",
        "3",
        "--all-folds",
        "--max-steps",
        "4",
        "--demo-size",
        "96",
        "--workdir",
        str(base),
    ]
    assert train.main(argv) == 0
    record = json.loads((base / "folds.json").read_text())
    assert [f["fold"] for f in record["folds"]] == [0, 1, 2]
    values = [f["best"] for f in record["folds"]]
    assert record["mean"] == pytest.approx(np.mean(values)) and record["monitor"] == "val_auc"
    for f in record["folds"]:
        summary = json.loads((base / f"fold-{f['fold']}" / "summary.json").read_text())
        assert summary["best"]["value"] == f["best"]
    oof = np.loadtxt(base / "oof.csv", delimiter=",", skiprows=1)
    assert np.array_equal(oof[:, 0], np.arange(96))  # every row once
    folds = splits.fold_assignment(demo.demo_comments(96, 0), 3, 0)
    assert np.array_equal(oof[:, 1], folds)
    assert ((oof[:, 2] > 0) & (oof[:, 2] < 1)).all()

    stamp = (base / "fold-0" / "summary.json").stat().st_mtime_ns
    assert train.main([*argv, "--resume"]) == 0  # finished folds are kept as they are
    assert (base / "fold-0" / "summary.json").stat().st_mtime_ns == stamp

    texts = tmp_path / "score.csv"
    texts.write_text("id,comment_text\na,thanks for the edit\nb,you are an idiot\n")
    outs = []
    for workdirs in (["fold-0"], ["fold-1"], ["fold-2"], ["fold-0", "fold-1", "fold-2"]):
        out = tmp_path / f"{len(outs)}.csv"
        assert (
            predict.main(
                [
                    "--workdir",
                    *[str(base / w) for w in workdirs],
                    "--input",
                    str(texts),
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        outs.append(np.loadtxt(out, delimiter=",", skiprows=1, usecols=1))
    np.testing.assert_allclose(outs[3], np.mean(outs[:3], axis=0), rtol=1e-6)


def test_an_ensemble_of_other_tasks_or_tokenizers_is_refused(tmp_path, minilm_dir):
    from types import SimpleNamespace

    from jaxtpu.core.errors import UserError
    from jaxtpu.predict import check_ensemble

    other_tok = tmp_path / "tok"
    from jaxtpu.core.data.tokens import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    tok.add_tokens(["zzzunseen"])
    tok.save_pretrained(other_tok)

    def model(task, tokenizer_dir):
        return SimpleNamespace(
            spec=SimpleNamespace(task=SimpleNamespace(name=task)), tokenizer_dir=tokenizer_dir
        )

    with pytest.raises(UserError, match="--workdir B is a ranking run, A a toxicity run"):
        check_ensemble([model("toxicity", minilm_dir), model("ranking", minilm_dir)], ["A", "B"])
    with pytest.raises(UserError, match="--workdir B has another tokenizer than A"):
        check_ensemble([model("toxicity", minilm_dir), model("toxicity", other_tok)], ["A", "B"])
    check_ensemble([model("toxicity", minilm_dir), model("toxicity", minilm_dir)], ["A", "B"])


# --------------------------------------------------------------------------- the notebooks


class NotebookAdamW:
    """transformers.AdamW (transformers < 5, correct_bias=True), written from its published
    `step`, for the plain loops below: eps on sqrt(v) before the bias correction, weight decay
    on the stepped weights."""

    def __init__(self, groups, lr, betas=(0.9, 0.999), eps=1e-6):
        self.groups, self.lr, self.betas, self.eps, self.t = groups, lr, betas, eps, 0
        self.state = {}

    def step(self):
        import torch

        self.t += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for group in self.groups:
                for p in group["params"]:
                    m, v = self.state.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
                    m.mul_(b1).add_(p.grad, alpha=1 - b1)
                    v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                    step_size = self.lr * np.sqrt(1 - b2**self.t) / (1 - b1**self.t)
                    p.addcdiv_(m, v.sqrt() + self.eps, value=-step_size)
                    p.add_(p, alpha=-self.lr * group["weight_decay"])
                    p.grad = None


def _notebook_setup(tmp_path, real_csv, task):
    """A tiny BERT directory, a notebook module's state dict (its own random weights), and
    32 training examples of real comments (rows, or pairs) with a validation file."""
    import csv

    import torch
    from helpers import notebook_model

    from parity_tests.harness import shared_init

    model_dir = shared_init(tmp_path / "tiny", task, "tiny", seed=3)
    model = notebook_model(model_dir, seed=5)
    torch.save(model.state_dict(), tmp_path / "model.bin")
    rows = list(csv.DictReader(open(real_csv, newline="", encoding="utf-8")))
    toxic = [r for r in rows if r["toxic"] == "1"]
    clean = [r for r in rows if r["toxic"] == "0"]
    for name, lo in (("train", 0), ("valid", 100)):
        with open(tmp_path / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            if task == "ranking":
                w.writerow(["less_toxic", "more_toxic"])
                w.writerows(
                    [clean[lo + i]["comment_text"], toxic[lo + i]["comment_text"]]
                    for i in range(32)
                )
            else:
                w.writerow(["comment_text", "toxic"])
                w.writerows(
                    [r["comment_text"], r["toxic"]]
                    for r in toxic[lo : lo + 8] + clean[lo : lo + 24]
                )
    return model_dir, model


def _jaxtpu_losses(tmp_path, preset, model_dir, **flags):
    from jaxtpu import train

    cfg = presets.get_preset(preset).replace(
        model_dir=str(model_dir),
        init_from=str(tmp_path / "model.bin"),
        precision="fp32",
        dropout=0.0,
        encoder_dropout=0.0,
        train_csv=str(tmp_path / "train.csv"),
        valid_csv=str(tmp_path / "valid.csv"),
        max_len=32,
        batch_size=4,
        valid_batch_size=4,
        epochs=20,
        log_every=1,
        workdir=str(tmp_path / "run"),
        **flags,
    )
    train.train_and_evaluate(cfg)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return np.array([x["loss"] for x in lines if x["event"] == "train"])


def _batch(model_dir, texts):
    import torch

    from jaxtpu.core.data.tokens import load_tokenizer, tokenize

    ids, mask, _ = tokenize(
        [readers.normalize_text(t) for t in texts], load_tokenizer(model_dir), 32
    )
    return torch.from_numpy(ids).long(), torch.from_numpy(mask).long()


@pytest.mark.model
def test_the_xla_notebook_preset_takes_the_notebooks_steps(tmp_path, real_csv):
    """--preset xla-notebook against the notebook's loop in plain PyTorch (its module,
    BCEWithLogitsLoss, transformers.AdamW with its no-decay groups, no scheduler, no clipping,
    lr 0.4e-5 x 8 cores), fp32, dropout off, one batch of 32 real comments, 20 steps."""
    import csv

    import torch

    model_dir, model = _notebook_setup(tmp_path, real_csv, "toxicity")
    ours = _jaxtpu_losses(tmp_path, "xla-notebook", model_dir)

    rows = list(csv.DictReader(open(tmp_path / "train.csv", newline="", encoding="utf-8")))
    ids, mask = _batch(model_dir, [r["comment_text"] for r in rows])
    y = torch.tensor([float(r["toxic"]) for r in rows])
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    named = list(model.named_parameters())
    groups = [
        {
            "params": [p for n, p in named if not any(nd in n for nd in no_decay)],
            "weight_decay": 0.001,
        },
        {"params": [p for n, p in named if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    opt = NotebookAdamW(groups, lr=0.4 * 1e-5 * 8)
    loss_fn, theirs = torch.nn.BCEWithLogitsLoss(), []
    model.eval()  # dropout off, as on our side
    for _ in range(20):
        loss = loss_fn(model(ids, mask), y)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    assert len(ours) == 20
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert abs(theirs[-1] - theirs[0]) > 1e-3  # it trained


@pytest.mark.model
def test_the_lightning_severity_preset_takes_the_notebooks_steps(tmp_path, real_csv):
    """--preset lightning-severity against the notebook's loop in plain PyTorch
    (MarginRankingLoss(0.5), transformers.AdamW on every parameter with weight decay 1e-6,
    CosineAnnealingLR(T_max=500, eta_min=1e-6) stepped once per epoch), fp32, dropout off,
    one batch of 32 real pairs per epoch, 20 epochs."""
    import csv

    import torch

    model_dir, model = _notebook_setup(tmp_path, real_csv, "ranking")
    ours = _jaxtpu_losses(tmp_path, "lightning-severity", model_dir, fold_column="", patience=0)

    rows = list(csv.DictReader(open(tmp_path / "train.csv", newline="", encoding="utf-8")))
    less = _batch(model_dir, [r["less_toxic"] for r in rows])
    more = _batch(model_dir, [r["more_toxic"] for r in rows])
    opt = NotebookAdamW([{"params": list(model.parameters()), "weight_decay": 1e-6}], lr=1e-4)
    sgd_twin = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)  # carries the lr
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(sgd_twin, T_max=500, eta_min=1e-6)
    loss_fn, theirs = torch.nn.MarginRankingLoss(margin=0.5), []
    model.eval()
    for _ in range(20):  # one batch per epoch: the scheduler steps after each
        opt.lr = sgd_twin.param_groups[0]["lr"]
        loss = loss_fn(model(*more), model(*less), torch.ones(32))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
        sgd_twin.step()
        scheduler.step()
    assert len(ours) == 20
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert abs(theirs[-1] - theirs[0]) > 1e-3


def test_the_validation_batch_size_is_its_own(tmp_path):
    from jaxtpu.core.run import plan

    ids = np.ones((40, 16), np.int32)
    train = tokenized.Examples(ids, ids.copy(), np.zeros(40, np.float32))
    cfg = presets.tiny().replace(batch_size=2, valid_batch_size=5, num_devices=2)
    batcher = plan.Plan.make(cfg, train, 2).batcher
    assert (batcher.global_batch, batcher.eval_global_batch) == (4, 10)
    batches = list(batcher.eval_batches(np.full(23, 16)))
    assert [b.idx.size for b in batches] == [10, 10, 10]
    assert sorted(np.concatenate([b.idx[b.weight > 0] for b in batches])) == list(range(23))
    same = plan.Plan.make(cfg.replace(valid_batch_size=0), train, 2).batcher
    assert same.eval_global_batch == 4


def test_the_margin_reaches_both_sides_losses():
    import torch

    from jaxtpu import steps
    from torchxla_ref import steps as torch_steps

    scores = np.array([[0.1, 0.5], [0.3, 0.2], [0.0, 2.0]], np.float32)
    ones = np.ones(3, np.float32)
    for margin in (0.5, 0.3, 0.0):
        want = np.maximum(0.0, margin - (scores[:, 1] - scores[:, 0]))
        ours = np.asarray(steps.LOSSES["ranking"](scores, ones, margin))
        theirs = torch_steps.LOSSES["ranking"](torch.tensor(scores), torch.tensor(ones), margin)
        np.testing.assert_allclose(ours, want, rtol=1e-6)
        np.testing.assert_allclose(theirs.numpy(), want, rtol=1e-6)
