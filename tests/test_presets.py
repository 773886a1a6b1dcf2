"""The notebook presets (`jaxtpu.core.flags.presets`) take the notebooks' own steps, written
in plain PyTorch beside them, and their knobs (validation batch size, margin) reach both
sides."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxtpu.core.data import templates, tokenized
from jaxtpu.core.flags import presets


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
        [templates.normalize_text(t) for t in texts], load_tokenizer(model_dir), 32
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

    from jaxtpu.engine import steps
    from torchxla_ref import steps as torch_steps

    scores = np.array([[0.1, 0.5], [0.3, 0.2], [0.0, 2.0]], np.float32)
    ones = np.ones(3, np.float32)
    for margin in (0.5, 0.3, 0.0):
        want = np.maximum(0.0, margin - (scores[:, 1] - scores[:, 0]))
        ours = np.asarray(steps.LOSSES["ranking"](scores, ones, margin))
        theirs = torch_steps.LOSSES["ranking"](torch.tensor(scores), torch.tensor(ones), margin)
        np.testing.assert_allclose(ours, want, rtol=1e-6)
        np.testing.assert_allclose(theirs.numpy(), want, rtol=1e-6)
