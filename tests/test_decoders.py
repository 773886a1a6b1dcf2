"""The decoder families (Qwen3, Qwen2.5, Llama 3) as classifiers: transformers' own
`*ForSequenceClassification` (the score of the last token that is not padding) against
jaxtpu's `--head hf`, with right and left padding, a text that ends in the pad token, and their
configs' checks. Forward, gradients and the export round trip of their encoders are
`tests/test_families.py`'s, with every other family's."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.readers import read_comments
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.families import default_pooling, get_family
from jaxtpu.core.hf.modelspec import ModelSpec
from jaxtpu.engine import weights
from parity_tests.families import DECODER_NAMES, build

torch = pytest.importorskip("torch", reason="the transformers reference needs torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory, family_dirs) -> dict[str, Path]:
    """Each decoder's test checkpoint as a one-label `*ForSequenceClassification` saved by
    transformers itself (its `score` seeded and widened past its 0.02 init)."""
    root = tmp_path_factory.mktemp("decoders")
    out = {}
    for name in DECODER_NAMES:
        base = family_dirs[name]
        config = transformers.AutoConfig.from_pretrained(str(base))
        config.num_labels = 1
        config.problem_type = "multi_label_classification"
        torch.manual_seed(0)
        clf = transformers.AutoModelForSequenceClassification.from_config(config).eval()
        clf.load_state_dict(
            {
                **{
                    f"model.{k}": v
                    for k, v in transformers.AutoModel.from_pretrained(str(base))
                    .state_dict()
                    .items()
                },
                "score.weight": torch.randn(1, config.hidden_size),
            }
        )
        clf.save_pretrained(str(root / f"{name}-clf"))
        transformers.AutoTokenizer.from_pretrained(str(base)).save_pretrained(
            str(root / f"{name}-clf")
        )
        out[name] = root / f"{name}-clf"
    return out


def _texts() -> list[str]:
    texts = read_comments(SAMPLE_CSV).texts
    return [texts[i] for i in range(0, 400, 50)] + ["ok", "you are a nice person"]


@pytest.mark.model
@pytest.mark.parametrize("name", DECODER_NAMES)
def test_the_hf_head_scores_the_last_real_token_as_transformers_does(name, classifiers):
    clf_dir = classifiers[name]
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(clf_dir)).eval()
    cfg = Config().replace(model_dir=str(clf_dir), precision="fp32", max_len=48, head="hf")
    spec = RunSpec.resolve(cfg, 1)
    assert spec.pooling == "last"
    model = weights.load_model(cfg, spec, head_required=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(clf_dir))
    texts = _texts()
    pad = tok.pad_token
    # a text ending in the pad token: transformers reads the token before it, and so must we
    texts.append(texts[-1] + pad)
    for side in ("right", "left"):
        tok.padding_side = side
        batch = tok(
            texts, max_length=48, truncation=True, padding="max_length", return_tensors="np"
        )
        ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
        assert (mask.sum(1) < 48).any()
        with torch.no_grad():
            theirs = (
                clf(
                    input_ids=torch.from_numpy(ids).long(),
                    attention_mask=torch.from_numpy(mask).long(),
                )
                .logits[:, 0]
                .double()
                .numpy()
            )
        ours = np.asarray(
            jax.jit(model.module.apply)({"params": model.params}, ids, mask), np.float64
        )
        assert np.abs(ours - theirs).max() < 1e-5, side


def test_decoder_configs_are_read_and_their_refusals_are_one_line():
    base = {"model_type": "qwen3", "pad_token_id": 0, "vocab_size": 50, "hidden_size": 32}
    base |= {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    enc = EncoderConfig.from_hf_dict(base)
    assert (enc.attention_head_size, enc.qk_norm, enc.qkv_bias) == (16, True, False)
    # the hub's older form of the rotary base and Llama 3.1's scaling
    llama = {**base, "model_type": "llama", "rope_theta": 500000.0}
    llama["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    enc = EncoderConfig.from_hf_dict(llama)
    assert enc.global_rope_theta == 500000.0 and enc.rope_scaling == (8.0, 1.0, 4.0, 8192.0)
    assert EncoderConfig.from_hf_dict(enc.to_hf_dict()) == enc
    refusals = [
        ({**base, "pad_token_id": None}, "no pad_token_id"),
        ({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({**base, "use_sliding_window": True}, "use_sliding_window=True"),
        ({**base, "layer_types": ["sliding_attention"]}, "layer_types"),
        ({**base, "num_key_value_heads": 3}, "does not divide"),
    ]
    for config, message in refusals:
        with pytest.raises(ConfigError, match=message):
            EncoderConfig.from_hf_dict(config)
    with pytest.raises(ConfigError, match="first token sees only itself"):
        default_pooling(get_family("qwen3"), "cls")
    assert json.dumps(EncoderConfig.from_hf_dict(base).to_hf_dict())  # plain JSON


def test_the_rules_task_on_a_decoder_needs_a_prompt(tmp_path):
    config = {"model_type": "qwen3", "pad_token_id": 0, "vocab_size": 50, "hidden_size": 32}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4}))
    cfg = Config().replace(model_dir=str(tmp_path), task="rules")
    with pytest.raises(ConfigError, match="as one prompt.*--prompt-template 'Rule: {rule}"):
        RunSpec.resolve(cfg, 1)
    prompt = cfg.replace(prompt_template="{rule}: {comment}")
    assert RunSpec.resolve(prompt, 1).segment_sep == -1  # one text: no token types


@pytest.mark.model
@pytest.mark.torch  # torchxla_ref's model: peft's import brings accelerate's torch_xla
@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_the_token_head_scores_the_log_odds_of_two_answers_before_training(name, tmp_path):
    """--token-head: before any training, the score is what transformers' causal LM says, the
    logit of one answer token minus the other's at the last real token, on both sides; from
    tied embeddings (the Qwen3 test checkpoint) or an lm_head of its own (Llama)."""
    from torchxla_ref.weights import load_model

    base = build(name, tmp_path / "base")
    config = transformers.AutoConfig.from_pretrained(str(base))
    torch.manual_seed(1)
    lm = transformers.AutoModelForCausalLM.from_config(config).eval()
    lm.model.load_state_dict(transformers.AutoModel.from_pretrained(str(base)).state_dict())
    if not config.tie_word_embeddings:
        with torch.no_grad():
            lm.lm_head.weight.normal_(0, 0.5)
    lm.save_pretrained(str(tmp_path / "lm"))
    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.save_pretrained(str(tmp_path / "lm"))
    # two answers of one token each in the small test vocabulary
    words = ["a", "I", "is", "to", "of", "in", "it", "and", "on", "be"]
    single = [w for w in words if len(tok(w, add_special_tokens=False)["input_ids"]) == 1]
    yes, no = single[:2]
    ids_of = [tok(w, add_special_tokens=False)["input_ids"] for w in (yes, no)]

    texts = _texts()
    batch = tok(texts, max_length=48, truncation=True, padding="max_length", return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
    last = mask.sum(1) - 1  # right padding: the last real token
    with torch.no_grad():
        logits = lm(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask))
    logits = logits.logits.double().numpy()[np.arange(len(texts)), last]
    expected = logits[:, ids_of[0][0]] - logits[:, ids_of[1][0]]

    cfg = Config().replace(
        model_dir=str(tmp_path / "lm"),
        head="hf",
        token_head=True,
        answer_tokens=f"{yes},{no}",
        precision="fp32",
        max_len=48,
    )
    spec = RunSpec.resolve(cfg, 1)
    assert spec.answer_ids == (ids_of[0][0], ids_of[1][0])
    model = weights.load_model(cfg, spec)
    ours = np.asarray(jax.jit(model.module.apply)({"params": model.params}, ids, mask), np.float64)
    assert np.abs(ours - expected).max() < 1e-4
    mine = ModelSpec(spec.encoder, pooling="last", head="hf", answers=spec.answer_ids)
    theirs = load_model(mine, spec.weights, 0)
    with torch.no_grad():
        got = theirs.eval()(torch.from_numpy(ids), torch.from_numpy(mask)).double().numpy()
    assert np.abs(got - expected).max() < 1e-4
    # without it, the head starts at random: the check above is not met by chance
    off = cfg.replace(token_head=False)
    plain = weights.load_model(off, RunSpec.resolve(off, 1))
    start = np.asarray(jax.jit(plain.module.apply)({"params": plain.params}, ids, mask), np.float64)
    assert np.abs(start - expected).max() > 1e-2


def test_the_token_head_is_refused_where_it_cannot_start(tmp_path):
    config = {"model_type": "qwen3", "pad_token_id": 0, "vocab_size": 50, "hidden_size": 32}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match="add --head hf"):
        from jaxtpu.core.flags.schema import validate

        validate(Config().replace(model_dir=str(tmp_path), token_head=True))
    cfg = Config().replace(model_dir=str(tmp_path), head="hf", token_head=True, task="multilabel")
    with pytest.raises(ConfigError, match="scores 6 outputs"):
        RunSpec.resolve(cfg, 1)


def _changed(src: Path, out: Path, config: dict | None = None, drop_pad: bool = False) -> Path:
    """A copy of checkpoint directory `src` with `config` merged into its config.json, and its
    tokenizer's pad token removed (`drop_pad`: Llama 3's tokenizer ships none)."""
    import shutil

    shutil.copytree(src, out)
    if config:
        path = out / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if drop_pad:
        path = out / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "pad_token": None}))
    return out


@pytest.mark.model
def test_one_pad_id_pads_and_pools_as_transformers_scores_each_text_alone(classifiers, tmp_path):
    """Issue 67, items 1 and 2: a tokenizer without a pad token pads with the config's
    pad_token_id (it used to end in transformers' 'Asking to pad' traceback), and a config
    whose pad_token_id is not the tokenizer's pads with the config's, the id the classifier
    pools by: each padded score is transformers' score of the text alone, with no padding."""
    from jaxtpu.core.data.tokens import encode_texts, load_tokenizer

    base = classifiers["llama"]
    eos = transformers.AutoTokenizer.from_pretrained(str(base)).eos_token_id
    texts = _texts()
    for name, changes in {
        "no pad token": dict(drop_pad=True),
        "config pads with eos": dict(config={"pad_token_id": eos}),
    }.items():
        d = _changed(base, tmp_path / name.replace(" ", "-"), **changes)
        cfg = Config().replace(model_dir=str(d), precision="fp32", max_len=48, head="hf")
        spec = RunSpec.resolve(cfg, 1)
        tok = load_tokenizer(d, spec.pad_id)
        assert tok.pad_token_id == spec.encoder.pad_token_id, name
        ids, mask = encode_texts(texts, tok, 48)
        assert (mask.sum(1) < 48).any() and (ids[mask == 0] == spec.pad_id).all(), name
        model = weights.load_model(cfg, spec, head_required=True)
        ours = np.asarray(
            jax.jit(model.module.apply)({"params": model.params}, ids, mask), np.float64
        )
        clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(d)).eval()
        alone = []
        for row, m in zip(ids, mask, strict=True):
            one = torch.from_numpy(row[m > 0][None]).long()
            with torch.no_grad():
                alone.append(float(clf(input_ids=one).logits[0, 0]))
        assert np.abs(ours - np.array(alone)).max() < 1e-5, name


def test_a_config_without_pad_token_id_pads_with_eos():
    base = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "num_attention_heads": 4}
    assert EncoderConfig.from_hf_dict({**base, "eos_token_id": [7, 9]}).pad_token_id == 7
    assert (
        EncoderConfig.from_hf_dict({**base, "pad_token_id": 3, "eos_token_id": 7}).pad_token_id == 3
    )


@pytest.mark.model
def test_the_token_cache_key_holds_the_pad_id_and_side(classifiers):
    """Issue 67, item 3: the cached arrays are padded with the pad id on its side, so a
    tokenizer that pads otherwise must not read another's entry."""
    from jaxtpu.core.data.tokens import tokenizer_fingerprint

    tok = transformers.AutoTokenizer.from_pretrained(str(classifiers["qwen3"]))
    first = tokenizer_fingerprint(tok)
    assert tokenizer_fingerprint(tok) == first  # stable
    tok.pad_token = tok.convert_ids_to_tokens(tok.pad_token_id + 1)
    second = tokenizer_fingerprint(tok)
    tok.padding_side = "left" if tok.padding_side == "right" else "right"
    assert len({first, second, tokenizer_fingerprint(tok)}) == 3


@pytest.mark.model
def test_the_token_head_refuses_a_classifier_checkpoint(classifiers):
    """Issue 67, item 4: --token-head on a *ForSequenceClassification directory (no LM head)
    used to load its score head silently while config.json said token_head: true."""
    from jaxtpu.core.errors import CheckpointError

    d = classifiers["qwen3"]
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    words = [w for w in ("a", "I", "is", "to", "of", "in", "it", "and")]
    single = [w for w in words if len(tok(w, add_special_tokens=False)["input_ids"]) == 1]
    cfg = Config().replace(
        model_dir=str(d), head="hf", token_head=True, answer_tokens=",".join(single[:2])
    )
    with pytest.raises(CheckpointError, match="drop --token-head"):
        weights.load_model(cfg, RunSpec.resolve(cfg, 1))


@pytest.mark.model
@pytest.mark.torch  # torchxla_ref's model: peft's import brings accelerate's torch_xla
@pytest.mark.parametrize("name", ["qwen3", "llama"])  # qwen2 is qwen3's layer less qk-norm
def test_a_decoder_classifier_exports_to_onnx_and_scores_as_jaxtpu(name, classifiers, tmp_path):
    """Issue 67, item 17: `export --format onnx` of a decoder (the graph torch's exporter
    writes of the torch side's model, as for the encoders) scores as jaxtpu does in fp32, at
    batch sizes and lengths it was not traced at, right padding read at the last real token."""
    pytest.importorskip("onnxruntime", reason="the ONNX export needs onnxruntime")
    from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
    from torchxla_ref import onnxexport
    from torchxla_ref.weights import load_model

    clf_dir = classifiers[name]
    cfg = Config().replace(model_dir=str(clf_dir), precision="fp32", max_len=48, head="hf")
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    torch_model = load_model(ModelSpec(spec.encoder, pooling=spec.pooling, head="hf"), clf_dir, 0)
    torch_model = torch_model.eval()
    path = onnxexport.export_onnx(torch_model, tmp_path / "model.onnx", spec.encoder)
    session = onnxexport.session(path)
    tok = load_tokenizer(clf_dir, spec.pad_id)
    texts = _texts()
    for part, length in ((texts[-3:], 40), (texts, 24)):
        n = len(part)
        ids, mask = encode_texts(part, tok, length)
        assert (mask.sum(1) < length).any()  # padded rows among them
        ours = np.asarray(
            jax.jit(model.module.apply)({"params": model.params}, ids, mask), np.float64
        )
        feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
        theirs = session.run(None, feeds)[0]
        assert theirs.shape == (n, 1)
        assert np.abs(theirs[:, 0] - ours).max() < 1e-4
