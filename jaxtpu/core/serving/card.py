"""A served model's version and its card (framework-free).

The version is a content hash: of the weights (every array's name, dtype, shape and bytes), the
tokenizer's files, the attribute map, the calibration and jaxtpu's version. Two servers of the
same model answer the same version; retraining, re-calibrating or renaming an attribute gives
another. Perspective's scores changed without one ("Bye Bye Perspective API", arXiv
2604.25580); these cannot.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

CHUNK = 1 << 20


def digest_arrays(arrays: Iterable[tuple[str, Any]]) -> str:
    """sha256 of named arrays, in name order: each name, dtype, shape and C-order bytes."""
    h = hashlib.sha256()
    for name, value in sorted(arrays, key=lambda kv: kv[0]):
        a = np.ascontiguousarray(np.asarray(value))
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def digest_file(path: str | Path) -> str:
    """sha256 of one file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def digest_dir(directory: str | Path, names: Iterable[str] | None = None) -> str:
    """sha256 of the files of a directory (or of `names` in it that exist), by name."""
    root = Path(directory)
    files = (
        sorted(p for p in root.iterdir() if p.is_file())
        if names is None
        else sorted(root / n for n in names if (root / n).is_file())
    )
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}|{digest_file(p)}|".encode())
    return h.hexdigest()


def model_version(parts: Mapping[str, Any]) -> str:
    """The version of a served model from its parts' digests or JSON-able values (weights,
    tokenizer, attributes, calibration, jaxtpu): 'jaxtpu-' and 16 hex digits."""
    text = json.dumps(dict(parts), sort_keys=True, separators=(",", ":"))
    return "jaxtpu-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def numeric(meta: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a best checkpoint's record: its numeric values."""
    return {k: v for k, v in meta.items() if isinstance(v, int | float)}


def validation_summary(metrics: Mapping[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    """What a run's best evaluation says of each column (`val_auc_<column>`, or `val_auc` for a
    one-column model) and of its bias and language breakdowns, from its metrics."""
    columns = list(columns)
    out: dict[str, Any] = {"auc": {}}
    for c in columns:
        key = f"val_auc_{c}" if f"val_auc_{c}" in metrics else None
        if key is None and len(columns) == 1 or (key is None and c == columns[0]):
            key = "val_auc" if "val_auc" in metrics else None
        if key and _finite(metrics[key]):
            out["auc"][c] = float(metrics[key])
    for key in ("val_mean_auc", "val_jigsaw_bias", "val_mean_language_auc", "val_mean_rule_auc"):
        if key in metrics and _finite(metrics[key]):
            out[key] = float(metrics[key])
    bias = {k: float(v) for k, v in metrics.items() if k.startswith("val_") and _bias_key(k)}
    if bias:
        out["bias"] = bias
    return out


def _bias_key(key: str) -> bool:
    return any(part in key for part in ("subgroup_auc", "bpsn_auc", "bnsp_auc", "power_mean"))


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and np.isfinite(value)


def languages_of(metrics: Mapping[str, Any]) -> list[str]:
    """The languages a run was validated on: those of its per-language AUCs
    (`val_auc_lang_<code>`), or English when it has none (every Jigsaw file but
    Multilingual's)."""
    found = sorted(k[len("val_auc_lang_") :] for k in metrics if k.startswith("val_auc_lang_"))
    return found or ["en"]


def build(
    source: str,
    task: str,
    columns: Iterable[str],
    attributes: list[dict[str, str]],
    languages: list[str],
    cfg: Any,
    metrics: Mapping[str, Any],
    config: Mapping[str, Any],
    weights: str,
    tokenizer_dir: str | Path,
    calibration: dict[str, Any] | None,
    jaxtpu_version: str,
    scoring: str = "",
) -> tuple[str, dict[str, Any]]:
    """A model's version and card: what `GET /v1/model` answers and `jaxtpu export` writes
    (`CARD_FILE`). `weights` is the weights' digest (`digest_arrays`, or an ONNX graph's
    `digest_file`); `cfg` the run's `Config`, `metrics` its best evaluation's, `config` the
    run's recorded config, `calibration` the record applied (None: none), `scoring` the
    precision it is scored in when not the one it trained in, and why ('' when it is: the
    version is then what it always was)."""
    tokenizer = Path(tokenizer_dir)
    parts = {
        "weights": weights,
        "tokenizer": digest_dir(tokenizer) if tokenizer.is_dir() else "",
        "attributes": attributes,
        "calibration": calibration,
        "jaxtpu": jaxtpu_version,
    }
    if scoring:
        parts["scoring"] = scoring
    version = model_version(parts)
    files = {}
    for name in ("train_csv", "valid_csv", "extra_train"):
        path = getattr(cfg.data, name, None)
        if path and Path(path).is_file():
            files[name] = {"path": str(path), "sha256": digest_file(path)}
        elif path:
            files[name] = {"path": str(path), "sha256": None}
    card = {
        "version": version,
        "source": source,
        "task": task,
        "attributes": attributes,
        "columns": list(columns),
        "languages": languages,
        "precision": cfg.train.precision,
        **({"scored_in": scoring} if scoring else {}),
        "max_len": cfg.data.max_len,
        "validation": validation_summary(metrics, cfg.task.label_columns),
        "training_files": files,
        "calibration": calibration,
        "perspective_scale": perspective_scale(attributes, calibration),
        "parts": parts,
        "config": json.loads(json.dumps(dict(config), default=str)),
    }
    return version, card


NO_SCALE = "no history: jaxtpu's own scale (the calibrated probability of the label)"


def perspective_scale(
    attributes: list[dict[str, str]], calibration: dict[str, Any] | None
) -> dict[str, Any]:
    """Per attribute, whether its scores are on Perspective's scale: the map's record (fitted
    on how many comments, from which source, of which dates, by which Perspective models, and
    whether the attribute is read out of the model's vector: on how many comments, at which
    L2 strength, beside how many of the text's n-grams), or `NO_SCALE`."""
    maps = {m["column"]: m for m in (calibration or {}).get("perspective", [])}
    reads = {r["column"]: r for r in (calibration or {}).get("readouts", [])}
    out: dict[str, Any] = {}
    for a in attributes:
        m, r = maps.get(a["column"]), reads.get(a["column"])
        if not m:
            out[a["name"]] = NO_SCALE
            continue
        out[a["name"]] = {k: m[k] for k in ("rows", "source", "dates", "models")}
        out[a["name"]]["method"] = m.get("method", "quantile")
        if r:
            grams = {"ngrams": len(r["grams"])} if r.get("grams") else {}
            out[a["name"]]["readout"] = {"rows": r["rows"], "l2": r["l2"], **grams}
    return out


CARD_FILE = "model_card.json"  # the card an export carries

# an absolute path of this machine's (POSIX, a Windows drive, or the home's), where a value
# starts or after a space or `=`: `--workdir /srv/runs/a`, `/data/train.csv`; not a URL's path
_ABSOLUTE = re.compile(r"(?:(?<=[\s=])|^)(?:[A-Za-z]:[\\/]|~/|/)[^\s]*")


def public(value: Any) -> Any:
    """A card as the server shows it (`GET /v1/model`, to any key holder, a page's key
    included): every absolute path of the server's machine cut to its last part (the run
    directory's name, the training file's), so it tells what was trained and served without
    telling where the server keeps it; everything else as it is."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: re.split(r"[\\/]", m.group(0).rstrip("\\/"))[-1], value)
    if isinstance(value, dict):
        return {k: public(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [public(v) for v in value]
    return value
