"""Every encoder family against transformers' own PyTorch model of it: forward (fp32, bf16),
fp32 gradients, the export round trip, its tokenizer, its config checks, and a training run.

The checkpoints are small random-init models built with transformers' classes and a tokenizer
of the family's kind trained on real comments (`parity_tests.families`); the comments scored
are real ones of several lengths, padded."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.hf import directory as hf
from jaxtpu.core.hf import tokenizer_dir
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.families import FAMILIES
from jaxtpu.engine import weights
from parity_tests import checks, forward
from parity_tests.families import (
    DECODER_NAMES,
    FAMILY_NAMES,
    VARIANT_TOKENIZERS,
    VARIANTS,
    tokenizer_kind,
)

torch = pytest.importorskip("torch", reason="the transformers reference needs torch")
transformers = pytest.importorskip("transformers")

ALL = FAMILY_NAMES + tuple(VARIANTS) + DECODER_NAMES
TOKENIZER_MODEL = {"wordpiece": "WordPiece", "bpe": "BPE", "unigram": "Unigram", "spm-bpe": "BPE"}


def _exported(model_dir: Path, out: Path) -> Path:
    """The checkpoint as jaxtpu loads it (a seeded head added), written back by jaxtpu's
    export path: what a fine-tuned run's `python -m jaxtpu.export` writes."""
    cfg = Config().replace(model_dir=str(model_dir), precision="fp32", max_len=64)
    model = weights.load_model(cfg, RunSpec.resolve(cfg))
    meta = {"task": "toxicity", "pooling": model.module.pooling}
    return weights.save_hf(model.params, model.encoder, out, model_dir, meta)


@pytest.mark.compile
@pytest.mark.parametrize("name", ALL)
def test_family_matches_transformers_and_exports_what_automodel_loads(name, family_dirs, tmp_path):
    model_dir = family_dirs[name]
    enc = EncoderConfig.from_hf_dict(json.loads((model_dir / "config.json").read_text()))
    assert enc.model_type == VARIANTS.get(name, name)
    export = _exported(model_dir, tmp_path / "export")

    # the export: transformers' AutoModel loads it with nothing missing or unexpected, as the
    # same class, and every encoder tensor is the checkpoint's, bit for bit
    model, info = transformers.AutoModel.from_pretrained(str(export), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(model).__name__ == enc.family.architecture
    original, written = hf.read_state_dict(model_dir), hf.read_state_dict(export)
    assert set(written) == set(original)
    assert all(np.array_equal(written[k], v) for k, v in original.items())

    # forward and gradients on real comments: jaxtpu vs transformers (loading the export)
    ids, mask, labels = forward.batch(str(SAMPLE_CSV), str(export), 16, 64)
    assert (mask.sum(1) < 64).any() and (mask.sum(1) == 64).any()  # padded and full rows
    args = Namespace(model_dir=str(export), grads=True, capture=False, plant_fault=None)
    out = {}
    for side, precision in (("jax", "fp32"), ("jax", "bf16"), ("hf", "fp32")):
        args.precision, args.grads = precision, precision == "fp32"
        run = forward.run_jax if side == "jax" else forward.run_torch
        extra = () if side == "jax" else ("cpu",)
        out[side, precision] = {**run(args, ids, mask, labels, *extra), "attention_mask": mask}
    results = checks.family_results(name, out)
    assert len(results) == 5
    failed = [f"{r.check}: {r.measured:.3g} > {r.tolerance:g} {r.detail}" for r in results]
    assert all(r.passed for r in results), "\n".join(
        line for line, r in zip(failed, results, strict=True) if not r.passed
    )


@pytest.mark.compile
def test_the_parity_worker_computes_deberta_gradients_in_bf16(family_dirs, tmp_path):
    """`parity_tests.forward --precision bf16 --grads` (the parity report's families step) on
    DeBERTa, whose relative terms' backward matmuls XLA:CPU has no kernel for op by op: the
    worker runs them jitted, as training does, and every gradient is finite."""
    export = _exported(family_dirs["deberta-v2"], tmp_path / "export")
    ids, mask, labels = forward.batch(str(SAMPLE_CSV), str(export), 8, 32)
    args = Namespace(model_dir=str(export), grads=True, capture=False, plant_fault=None,
                     precision="bf16")  # fmt: skip
    grads = {k: v for k, v in forward.run_jax(args, ids, mask, labels).items() if "grad/" in k}
    assert any("rel_embeddings" in k for k in grads), sorted(grads)[:5]
    assert all(np.isfinite(v).all() for v in grads.values())
    assert any(np.abs(v).max() > 0 for v in grads.values())


@pytest.mark.parametrize("name", FAMILY_NAMES + tuple(VARIANT_TOKENIZERS))
def test_each_family_ships_its_own_kind_of_tokenizer(name, family_dirs):
    from jaxtpu.core.data.tokens import load_tokenizer

    tok = load_tokenizer(family_dirs[name])
    config = json.loads((family_dirs[name] / "config.json").read_text())
    kind, _, (first, last) = tokenizer_kind(name)
    assert type(tok.backend_tokenizer.model).__name__ == TOKENIZER_MODEL[kind]
    assert tok.pad_token_id == config["pad_token_id"]
    ids = tok(["you are a nice person"])["input_ids"][0]
    assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == [first, last]  # [CLS] ... [SEP]


RAW = [
    "  you are an\n\nidiot\t and a  liar ",
    "thanks\r\nfor the edit\u3000\u00a0of the page\x1cok",
    "\n\tfine\n",
]


@pytest.mark.parametrize("name", FAMILY_NAMES + tuple(VARIANT_TOKENIZERS) + DECODER_NAMES)
def test_an_exported_tokenizer_scores_raw_text_as_jaxtpu_does(name, family_dirs, tmp_path):
    """Issue 57: jaxtpu collapses whitespace before tokenizing (`normalize_text`), the export's
    tokenizer did not, so pipeline() on raw comments saw newline and double-space tokens the
    model never saw (byte-level BPE and SentencePiece families). The export's tokenizer.json
    now does the same first: raw text through it gives jaxtpu's tokens."""
    from jaxtpu.core.data.templates import normalize_text
    from jaxtpu.core.data.tokens import load_tokenizer

    source = load_tokenizer(family_dirs[name])
    assert tokenizer_dir.export_tokenizer(family_dirs[name], tmp_path)
    exported = load_tokenizer(tmp_path)
    jaxtpu_ids = source([normalize_text(t) for t in RAW])["input_ids"]
    assert exported(RAW)["input_ids"] == jaxtpu_ids
    assert exported([normalize_text(t) for t in RAW])["input_ids"] == jaxtpu_ids  # unchanged
    if tokenizer_kind(name)[0] != "wordpiece":  # its own normalizer cleans whitespace already
        assert source(RAW)["input_ids"] != jaxtpu_ids  # what an export without the rule did
    again = tmp_path / "again"  # an export of a run trained from an export: one rule, once
    again.mkdir()
    tokenizer_dir.export_tokenizer(tmp_path, again)
    assert (again / "tokenizer.json").read_text() == (tmp_path / "tokenizer.json").read_text()


def test_a_sentencepiece_model_alone_loads_as_a_fast_tokenizer(tmp_path):
    """DeBERTa-v3 checkpoints ship spm.model and no tokenizer.json: transformers converts it,
    and the ids are SentencePiece's own, between [CLS] and [SEP]."""
    import sentencepiece as spm

    from jaxtpu.core.data.readers import read_comments
    from jaxtpu.core.data.tokens import load_tokenizer
    from parity_tests.families import sentencepiece_dir

    d = sentencepiece_dir(tmp_path / "spm-only")
    assert not (d / "tokenizer.json").exists()
    tok = load_tokenizer(d)
    assert type(tok.backend_tokenizer.model).__name__ == "Unigram" and tok.pad_token_id == 0
    sp = spm.SentencePieceProcessor(model_file=str(d / "spm.model"))
    texts = read_comments(SAMPLE_CSV).texts[:50]
    for text, ids in zip(texts, tok(texts)["input_ids"], strict=True):
        assert ids == [1, *sp.encode(text), 2], text
    tok.save_pretrained(str(tmp_path / "saved"))  # what a run directory keeps
    assert (tmp_path / "saved" / "tokenizer.json").exists()


def _cfg(model_type: str, **changes) -> dict:
    return {"model_type": model_type, "hidden_size": 32, "num_attention_heads": 4, **changes}


@pytest.mark.parametrize(
    "config, message",
    [
        (_cfg("gpt2"), "model_type='gpt2' is not supported; supported: bert, roberta"),
        (_cfg("roberta", hidden_act="relu"), "hidden_act='relu' is not supported for roberta"),
        (
            _cfg("bert", position_embedding_type="relative_key"),
            "position_embedding_type='relative_key' is not supported for bert",
        ),
        (_cfg("distilbert", activation="relu"), "activation='relu' is not supported"),
        (_cfg("deberta-v2", conv_kernel_size=3), "conv_kernel_size=3 is not supported"),
        (_cfg("deberta-v2", pos_att_type=["p2p"]), "pos_att_type=['p2p'] is not supported"),
        (_cfg("deberta-v2", norm_rel_ebd="batch_norm"), "norm_rel_ebd='batch_norm'"),
        (_cfg("deberta-v2", attention_head_size=16), "attention_head_size=16 is not supported"),
        (_cfg("modernbert", attention_bias=True), "attention_bias=True is not supported"),
        (_cfg("modernbert", hidden_activation="silu"), "hidden_activation='silu' is not"),
        (
            _cfg("modernbert", num_hidden_layers=2, layer_types=["full_attention", "chunked"]),
            "layer_types=['full_attention', 'chunked'] is not supported",
        ),
        (  # issue 58: was a ZeroDivisionError
            _cfg("modernbert", num_hidden_layers=2, global_attn_every_n_layers=0),
            "global_attn_every_n_layers=0 (expected an integer >= 1",
        ),
        (
            _cfg("modernbert", rope_parameters={"full_attention": {"rope_type": "linear"}}),
            "rope_parameters['full_attention'].rope_type='linear' is not supported",
        ),
        (_cfg("modernbert", vocab_size=600), "pad_token_id=50283 is outside the vocabulary"),
        (_cfg("modernbert", classifier_pooling="max"), "classifier_pooling='max'"),
        (_cfg("eurobert", hidden_act="gelu"), "hidden_act='gelu' is not supported for eurobert"),
        (
            _cfg("eurobert", vocab_size=600, pad_token_id=0, num_key_value_heads=3),
            "num_key_value_heads=3 does not divide num_attention_heads=4",
        ),
        (_cfg("eurobert", vocab_size=600, pad_token_id=0, head_dim=16), "head_dim=16"),
        (_cfg("eurobert", vocab_size=600), "pad_token_id=128001 is outside the vocabulary"),
    ],
)
def test_unsupported_config_options_are_one_line_errors_naming_them(config, message):
    with pytest.raises(ConfigError) as e:
        EncoderConfig.from_hf_dict(config, "config.json")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_max_len_beyond_the_position_table_is_a_one_line_error(family_dirs):
    def encoder_config(cfg):
        return RunSpec.resolve(cfg).encoder

    # the RoBERTa test checkpoint has 130 positions, numbered from pad_token_id + 1 = 2
    roberta = Config().replace(model_dir=str(family_dirs["roberta"]))
    assert encoder_config(roberta.replace(max_len=128)).max_tokens == 128
    with pytest.raises(ConfigError, match=r"--max-len 129: the roberta encoder's position table"):
        encoder_config(roberta.replace(max_len=129))
    with pytest.raises(ConfigError, match="holds at most 128 tokens"):
        encoder_config(Config().replace(model_dir=str(family_dirs["bert"]), max_len=200))
    # DeBERTa-v3 numbers no absolute positions: relative ones reach any length
    deberta = Config().replace(model_dir=str(family_dirs["deberta-v2"]), max_len=512)
    assert encoder_config(deberta).max_tokens is None
    # ModernBERT's rotary positions go to its max_position_embeddings (256 in the test one)
    modern = Config().replace(model_dir=str(family_dirs["modernbert"]), max_len=256)
    assert encoder_config(modern).max_tokens == 256
    with pytest.raises(ConfigError, match="modernbert encoder's rotary positions go to 256 tok"):
        encoder_config(modern.replace(max_len=1024))


def test_every_family_has_a_default_pooling_and_refuses_a_pooler_it_lacks(family_dirs):
    for name, family in FAMILIES.items():
        cfg = Config().replace(model_dir=str(family_dirs[name]))
        spec = RunSpec.resolve(cfg)
        if name == "modernbert":  # its config's classifier_pooling ('mean' in the test one)
            assert spec.pooling == "mean" != family.default_pooling
            assert "config.json's classifier_pooling" in spec.describe_model(10**6, 0)
        else:
            assert spec.pooling == family.default_pooling
        if not family.pooler:
            with pytest.raises(ConfigError, match=f"--pooling pooler: {name} has no pooler"):
                RunSpec.resolve(cfg.replace(pooling="pooler"))


def test_modernbert_reads_both_config_forms(family_dirs):
    """The hub's older ModernBERT configs (global_attn_every_n_layers, *_rope_theta,
    layer_norm_eps) read as the layer kinds, bases and epsilon transformers 5 writes, and write
    back to the same encoder."""
    new = json.loads((family_dirs["modernbert"] / "config.json").read_text())
    new["norm_eps"] = 2e-5  # not the default, so the older spelling must be read
    old = {k: v for k, v in new.items() if k not in ("layer_types", "rope_parameters")}
    old.update(global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=100.0)
    old["layer_norm_eps"] = old.pop("norm_eps")  # sentence-transformers' older spelling
    a, b = EncoderConfig.from_hf_dict(new), EncoderConfig.from_hf_dict(old)
    assert a == b and a.layer_types == ("full_attention", "sliding_attention", "full_attention")
    assert (a.global_rope_theta, a.local_rope_theta, a.local_attention) == (1000.0, 100.0, 16)
    assert a.layer_norm_eps == 2e-5
    assert EncoderConfig.from_hf_dict(a.to_hf_dict()) == a


@pytest.mark.model
@pytest.mark.parametrize("name", ["modernbert", "mmbert", "eurobert", "qwen3"])
def test_scanned_modernbert_is_the_unscanned_model(name, family_dirs):
    """--scan-layers: ModernBERT's layer 0 on its own, then groups of the layer-kind period
    (2 for the test ModernBERT's global/sliding, 3 for mmBERT's sliding, sliding, global)
    scanned; EuroBERT's layers one by one; the stacked params unstack to the originals and the
    scores are the unscanned model's."""
    import jax

    from jaxtpu.models import encoder as models
    from jaxtpu.models import layers

    cfg = Config().replace(model_dir=str(family_dirs[name]), precision="fp32", max_len=64)
    plain = weights.load_model(cfg, RunSpec.resolve(cfg))
    scanned = weights.load_model(cfg.replace(scan_layers=True), RunSpec.resolve(cfg))
    enc = scanned.params["bert"]["encoder"]
    period = {"modernbert": 2, "mmbert": 3, "eurobert": 1, "qwen3": 1}[name]
    every_alike = name in ("eurobert", "qwen3")
    assert set(enc) == ({"layers"} if every_alike else {"layer_0", "layers"})
    assert set(enc["layers"]) == {f"layer_{j}" for j in range(period)}
    back = layers.unstack_layers(scanned.params)
    flat = jax.tree_util.tree_leaves_with_path
    assert [p for p, _ in flat(back)] == [p for p, _ in flat(plain.params)]
    for (_, a), (_, b) in zip(flat(back), flat(plain.params), strict=True):
        np.testing.assert_array_equal(a, b)
    ids, mask, _ = forward.batch(str(SAMPLE_CSV), str(family_dirs[name]), 8, 64)
    ours = jax.jit(scanned.module.apply)({"params": scanned.params}, ids, mask)
    theirs = jax.jit(plain.module.apply)({"params": plain.params}, ids, mask)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)
    assert models.stack_for_scan(plain.encoder, plain.params).keys() == scanned.params.keys()


def test_an_exported_head_keeps_the_pooling_it_was_trained_with(family_dirs, tmp_path):
    import shutil

    export = tmp_path / "electra-export"
    shutil.copytree(family_dirs["electra"], export)
    (export / "jaxtpu_head.json").write_text(json.dumps({"task": "toxicity", "pooling": "mean"}))
    cfg = Config().replace(model_dir=str(export))
    spec = RunSpec.resolve(cfg)
    assert spec.pooling == "mean"  # electra's default is cls
    assert "pooling mean (as exported, jaxtpu_head.json)" in spec.describe_model(10**6, 0)
    assert RunSpec.resolve(cfg.replace(pooling="cls")).pooling == "cls"  # the flag wins


def test_family_defaults_are_transformers_config_defaults():
    """A key `save_pretrained` leaves out must read as transformers' own default."""
    classes = {
        "bert": transformers.BertConfig,
        "roberta": transformers.RobertaConfig,
        "xlm-roberta": transformers.XLMRobertaConfig,
        "distilbert": transformers.DistilBertConfig,
        "electra": transformers.ElectraConfig,
        "deberta-v2": transformers.DebertaV2Config,
        "modernbert": transformers.ModernBertConfig,
        "eurobert": transformers.EuroBertConfig,
        "qwen3": transformers.Qwen3Config,
        "qwen2": transformers.Qwen2Config,
        "llama": transformers.LlamaConfig,
    }
    assert set(classes) == set(FAMILIES)
    rope = {"global_rope_theta": "full_attention", "local_rope_theta": "sliding_attention"}
    for name, cls in classes.items():
        decoder = name in DECODER_NAMES  # refused without a pad id: any one will do
        ours = EncoderConfig.from_hf_dict(
            {"model_type": name, **({"pad_token_id": 0} if decoder else {})}
        )
        theirs = cls()
        for field in FAMILIES[name].fields:
            value = getattr(theirs, FAMILIES[name].hf_name(field), None)
            if decoder and field == "pad_token_id":
                continue
            if decoder and field == "head_dim":  # absent = hidden / heads
                value = value or theirs.hidden_size // theirs.num_attention_heads
            if decoder and field == "rope_scaling":  # 'default' rotary: none
                assert theirs.rope_parameters["rope_type"] == "default"
                value = ()
            if field == "pos_att_type":
                value = tuple(value or ())
            if field == "embedding_size" and name == "deberta-v2":
                value = getattr(theirs, "embedding_size", theirs.hidden_size)
            if field in ("position_buckets", "share_att_key", "norm_rel_ebd"):
                continue  # read with getattr defaults by the model, not set by the class
            if field == "layer_types":
                value = tuple(theirs.layer_types)
            if field in rope and name in ("eurobert", *DECODER_NAMES):  # one rotary base
                value = theirs.rope_parameters["rope_theta"]
            elif field in rope:
                value = theirs.rope_parameters[rope[field]]["rope_theta"]
            assert getattr(ours, field) == value, (name, field)


def test_bisection_has_a_module_on_both_sides_for_every_point_of_every_family():
    from torchxla_ref.models import Classifier

    for name in FAMILIES:
        config = _cfg(name, vocab_size=50, max_position_embeddings=40, pad_token_id=1)
        enc = EncoderConfig.from_hf_dict(config)
        modules = dict(Classifier(enc, 0.0).named_modules())
        points = forward.capture_points(enc)
        assert ("pooler" in points) == FAMILIES[name].pooler
        missing = [p for p in points if forward.torch_module(p, name) not in modules]
        assert not missing, (name, missing)


@pytest.mark.parametrize(
    "name, task",
    [
        ("xlm-roberta", "toxicity"),
        ("distilbert", "ranking"),
        ("electra", "multilabel"),
        ("modernbert", "ranking"),
        ("mmbert", "multilabel"),
        ("eurobert", "toxicity"),
    ],
)
@pytest.mark.model
def test_jaxtpu_trains_each_task_from_a_family_checkpoint(name, task, family_dirs, tmp_path):
    """RoBERTa, DeBERTa and ModernBERT train on both sides in the parity suite
    (test_family_trajectories); ModernBERT's ranking and mmBERT's multi-label run here."""
    from jaxtpu import train
    from jaxtpu.core.flags import presets

    cfg = presets.tiny().replace(
        model_dir=str(family_dirs[name]),
        task=task,
        train_csv="sample",
        max_rows=320,
        max_len=32,
        parallel="jit",
        precision="bf16",
        epochs=1,
        log_every=1,
        workdir=str(tmp_path / "run"),
    )
    summary = train.train_and_evaluate(cfg)
    assert summary["train_compiles"] == 1 and summary["total_steps"] >= 8
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["config"]["model"]["model_dir"] == str(family_dirs[name])
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in logged if x.get("event") == "train"]
    assert all(np.isfinite(losses))
    assert np.isfinite(summary["final"][cfg.task.monitor])


@pytest.mark.e2e
@pytest.mark.torch
def test_torch_side_trains_a_family_checkpoint_from_the_command_line(family_dirs, tmp_path):
    from parity_tests.harness import run_side

    run = run_side(
        "torch",
        tmp_path / "run",
        "--model-dir",
        str(family_dirs["distilbert"]),
        "--task",
        "ranking",
        "--train-csv",
        "sample",
        "--max-rows",
        "200",
        "--max-len",
        "32",
        "--parallel",
        "eager",
        "--num-devices",
        "1",
        "--batch-size",
        "16",
        "--max-steps",
        "4",
        "--precision",
        "fp32",
        "--log-every",
        "1",
    ).check()
    assert len(run.losses) == 4 and all(np.isfinite(run.losses))
    assert "model: distilbert (DistilBertModel)" in run.stderr + run.stdout
    assert "pooling cls (distilbert's default)" in run.stderr + run.stdout


@pytest.mark.model
def test_deberta_scanned_and_rematerialised_trains_like_the_plain_model(family_dirs, tmp_path):
    """The relative embeddings every layer shares stay outside the scanned layer stack; each
    stacked layer keeps its own --layer-lr-decay rate."""
    from jaxtpu import train
    from jaxtpu.core.flags import presets

    def losses(name, **memory):
        cfg = presets.tiny().replace(
            model_dir=str(family_dirs["deberta-v2"]),
            train_csv="sample",
            max_rows=200,
            max_len=32,
            parallel="jit",
            precision="fp32",
            max_steps=5,
            log_every=1,
            dropout=0.0,
            encoder_dropout=0.0,
            layer_lr_decay=0.3,
            head_lr=1e-2,
            workdir=str(tmp_path / name),
            **memory,
        )
        train.train_and_evaluate(cfg)
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["loss"] for x in lines if json.loads(x).get("event") == "train"]

    plain = losses("plain")
    scanned = losses("scanned", scan_layers=True, remat="layer", sharding="fsdp")
    assert len(plain) == 5
    np.testing.assert_allclose(scanned, plain, rtol=1e-5)
