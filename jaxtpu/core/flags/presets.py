"""The presets: named starting configurations; each docstring gives the command that runs it
and the result to expect (framework-free). Flags override a preset field by field.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.schema import Config


def demo() -> Config:
    """The default, and every flag's default: pretrained MiniLM fine-tuned on 2,000 real Jigsaw
    comments shipped with the package (`--train-csv sample`), in length buckets, 8 devices,
    bf16. Every other preset is this with its changes.

    Run: `python -m jaxtpu.train` (or `make train`).
    Expect: validation ROC AUC about 0.95 on 200 held-out real comments (the measured figure
    and time are in the README, "The two commands").
    """
    return Config()  # the schema's defaults: what `--help` shows and `Config()` means


def minilm() -> Config:
    """Pretrained MiniLM (6 x 384) with the Kaggle recipe: lr 5e-5, global batch 32, len 128.

    Run: `python -m jaxtpu.train --preset minilm --train-csv ../shared/data/jigsaw_toxic_dev.csv`
    Expect: about 0.98 validation ROC AUC on real comments after 1 epoch.
    """
    return Config().replace(train_csv=None, lr=5e-5, warmup_frac=0.0)


def bert_base() -> Config:
    """The 12 x 768 BERT-base shape (random init unless --model-dir points at bert-base).

    Run: `python -m jaxtpu.train --preset bert-base --model-dir /path/to/bert-base-uncased`.
    Expect: slow on CPU; meant for TPU VMs.
    """
    return Config().replace(
        model_dir=None,
        num_layers=12,
        hidden_size=768,
        num_heads=12,
        intermediate_size=3072,
        train_csv=None,
        buckets="none",
        lr=5e-5,
        warmup_frac=0.0,
    )


def tiny() -> Config:
    """A 2 x 64 random-init encoder on demo data: seconds per run, for tests and smoke checks.

    Run: `python -m jaxtpu.train --preset tiny`.
    """
    return Config().replace(
        model_dir=None,
        train_csv=None,
        max_len=16,
        demo_size=256,
        buckets="none",
        lr=3e-3,
        schedule="constant",
        warmup_frac=0.0,
        weight_decay=0.0,
        log_every=2,
        progress=False,
    )


def xla_notebook() -> Config:
    """The PyTorch/XLA Jigsaw notebook, as written. Its recipe, in its own terms:

        BertModel -> nn.Dropout(0.3) on the pooler output -> nn.Linear(hidden, 1)
        MAX_LEN = 224; batch 32 per core for training, 64 for validation
        no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]; weight_decay 0.001 otherwise
        lr = 0.4 * 1e-5 * xm.xrt_world_size()
        optimizer = AdamW(optimizer_parameters, lr=lr)   # transformers.AdamW: eps 1e-6
        no scheduler, no gradient clipping, nn.BCEWithLogitsLoss

    Run: `python -m jaxtpu.train --preset xla-notebook --model-dir DIR --train-csv
    jigsaw-toxic-comment-train.csv --valid-csv validation.csv` (DIR: the notebook's pretrained
    BERT directory; required).
    Expect: the notebook's losses step for step in fp32 with dropout off
    (tests/test_presets.py); its printed AUC differs (below).
    Not reproduced: `XLA_USE_BF16=1` keeps the weights and AdamW moments in bf16 (jaxtpu keeps
    fp32 masters and computes in bf16); the notebook's AUC is each core's AUC of its own
    slice, averaged by `xm.mesh_reduce` (jaxtpu's is one AUC over the whole set); its
    epochs and files are yours to give (--epochs, --train-csv, --valid-csv).
    """
    return Config().replace(
        model_dir=None,
        train_csv=None,
        dropout=0.3,
        max_len=224,
        buckets="none",
        lr=0.4e-5,
        scale_lr=True,
        adamw="transformers",
        adam_eps=1e-6,
        weight_decay=0.001,
        decay_params="not-bias-or-norm",
        schedule="constant",
        warmup_frac=0.0,
        clip_norm=0.0,
        task="toxicity",
        batch_size=32,
        valid_batch_size=64,
        epochs=1,
    )


def lightning_severity() -> Config:
    """The Lightning Rate Severity notebook (pairs of less/more toxic comments), as written:

        optimizer = AdamW(self.parameters(), lr=1e-4, weight_decay=1e-6)   # every parameter
        scheduler = CosineAnnealingLR(optimizer, T_max=500, eta_min=1e-6)
        return [optimizer], [scheduler]          # no interval: Lightning steps it per epoch
        criterion = nn.MarginRankingLoss(margin=0.5)
        ModelCheckpoint(monitor="val_loss", mode="min")
        EarlyStopping(monitor="val_loss", patience=2)
        folds from train_5folds.csv's kfold column, one model per fold

    (its AdamW is transformers.AdamW, eps 1e-6, as in the PyTorch/XLA notebook.)

    Run: `python -m jaxtpu.train --preset lightning-severity --model-dir DIR --train-csv
    train_5folds.csv --all-folds` (DIR: the notebook's pretrained model directory; required).
    Expect: the notebook's losses step for step in fp32 with dropout off
    (tests/test_presets.py); folds.json and oof.csv for the five folds.
    Not reproduced: the head's dropout is the ranking task's 0.2 and the batch sizes, length
    and epochs are jaxtpu's (--dropout, --batch-size, --valid-batch-size, --max-len,
    --epochs: set the notebook's). Lightning's `precision=16` (fp16 with GradScaler's
    dynamic loss scaling) is `--precision fp16` (docs/gpu.md); the preset's default is bf16,
    for a TPU.
    """
    return Config().replace(
        model_dir=None,
        train_csv=None,
        dropout=0.2,
        max_len=128,
        buckets="none",
        fold_column="kfold",
        lr=1e-4,
        adamw="transformers",
        adam_eps=1e-6,
        weight_decay=1e-6,
        decay_params="all",
        schedule="cosine",
        schedule_interval="epoch",
        t_max=500,
        eta_min=1e-6,
        warmup_frac=0.0,
        clip_norm=0.0,
        task="ranking",
        margin=0.5,
        monitor="val_loss",
        patience=2,
        epochs=3,
    )


PRESETS: dict[str, Callable[[], Config]] = {
    "demo": demo,
    "minilm": minilm,
    "bert-base": bert_base,
    "tiny": tiny,
    "xla-notebook": xla_notebook,
    "lightning-severity": lightning_severity,
}
# What a preset cannot guess: the notebooks' pretrained model is the user's to give.
NEEDS_MODEL_DIR = ("xla-notebook", "lightning-severity")


def check_needs(preset: str, cfg: Config) -> None:
    """Refuses a preset run without what the preset cannot supply (never a silent random
    init in place of the notebook's pretrained model)."""
    if preset in NEEDS_MODEL_DIR and not cfg.model.model_dir:
        raise ConfigError(
            f"--preset {preset} needs --model-dir: the pretrained checkpoint the notebook "
            "fine-tunes (a Hugging Face directory)"
        )


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()
