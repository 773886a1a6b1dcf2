"""LoRA on the decoders: jaxtpu's adapters against peft's own (`LoraConfig`,
`get_peft_model` on transformers' `*ForSequenceClassification`), forward and the gradients of
what trains, in fp32, with right and left padding; what trains and what is frozen (no
gradient, no optimizer state, bf16 kernels); the flags' refusals. The LoRA training
trajectory against torch_xla is `parity_tests` ("trajectory qwen3 lora")."""

from __future__ import annotations

import numpy as np
import pytest

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.readers import read_comments
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.lora import LoraSpec, held_in_bf16, initial_a, peft_key, trains

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def test_what_trains_and_what_is_held_in_bf16_under_lora():
    assert trains(("bert", "encoder", "layer_0", "self_attn", "q_proj", "lora_a"))
    assert trains(("score", "kernel"))  # the head trains in full
    assert not trains(("bert", "encoder", "layer_0", "self_attn", "q_proj", "kernel"))
    assert held_in_bf16(("bert", "encoder", "layers", "layer", "mlp", "up_proj", "kernel"))
    assert not held_in_bf16(("bert", "embed_tokens", "embedding"))  # starts the fp32 stream
    assert not held_in_bf16(("bert", "norm", "scale"))
    assert not held_in_bf16(("score", "kernel"))
    key = "layers.0.self_attn.q_proj.lora_A.weight"
    assert peft_key("base_model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == key
    assert peft_key("layers.1.mlp.up_proj.base_layer.weight") == "layers.1.mlp.up_proj.weight"
    a = initial_a(key, 64, 4, seed=0)
    assert a.shape == (4, 64) and a.dtype == np.float32 and np.abs(a).max() <= 1 / 8
    assert np.abs(a).max() > 0.9 / 8  # uniform over the whole of +-1/sqrt(in)
    assert not np.array_equal(a, initial_a(key, 64, 4, seed=1))
    assert not np.array_equal(a, initial_a(key.replace("q_proj", "k_proj"), 64, 4, seed=0))
    spec = LoraSpec(4, 8.0, 0.0, ("q_proj",))
    assert spec.scaling == 2.0 and LoraSpec.from_dict(spec.to_dict()) == spec


def test_the_lora_flags_resolve_and_refuse_in_one_line(tmp_path):
    lora = Config().replace(lora_rank=16).model.lora
    assert (lora.rank, lora.alpha, lora.targets) == (16, 32.0, tuple(TARGETS.split(",")))
    with pytest.raises(ConfigError, match="--lora-alpha without --lora-rank: LoRA is off"):
        Config().replace(lora_alpha=4.0)
    with pytest.raises(ConfigError, match="--lora-targets is empty"):
        Config().replace(lora_rank=4, lora_targets=" ,")
    with pytest.raises(ConfigError, match="LoRA, not the bert layer kind"):
        RunSpec.resolve(Config().replace(lora_rank=4, model_dir=""), 1)
    import json

    config = {"model_type": "qwen3", "pad_token_id": 0, "vocab_size": 50, "hidden_size": 32}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4}))
    cfg = Config().replace(model_dir=str(tmp_path), lora_rank=4, lora_targets="q_proj,query")
    with pytest.raises(ConfigError, match="--lora-targets query: not a dense layer of qwen3"):
        RunSpec.resolve(cfg, 1)
    spec = RunSpec.resolve(cfg.replace(lora_targets="q_proj"), 1)
    assert spec.model_key["lora"] == {
        "rank": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "targets": ["q_proj"],
    }


@pytest.mark.model
@pytest.mark.torch  # peft imports accelerate, which imports torch_xla
@pytest.mark.parametrize("name", ["qwen3", "qwen2"])
def test_lora_matches_peft_forward_and_gradients_in_fp32(name, tmp_path):
    """Both sides' adapters given the same nonzero A and B (B starts at zero, where A gets no
    gradient and the adapters change nothing), on every projection: logits, and the gradient
    of every adapter and of the head, against peft on transformers' own classifier."""
    torch = pytest.importorskip("torch", reason="the peft reference needs torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import jax
    import optax

    from jaxtpu.engine import steps, weights
    from parity_tests.families import build

    base = build(name, tmp_path / "base")
    config = transformers.AutoConfig.from_pretrained(str(base))
    config.num_labels = 1
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_config(config)
    clf.model.load_state_dict(transformers.AutoModel.from_pretrained(str(base)).state_dict())
    with torch.no_grad():
        clf.score.weight.normal_(0, 0.5)
    clf.save_pretrained(str(tmp_path / "clf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.save_pretrained(str(tmp_path / "clf"))

    cfg = Config().replace(
        model_dir=str(tmp_path / "clf"), head="hf", precision="fp32", max_len=40, lora_rank=4
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    flat = {k: np.asarray(v) for k, v in _flatten(model.params).items()}
    draw = np.random.default_rng(7)
    for path in flat:
        if path[-1] == "lora_b":  # nonzero, so that A has a gradient to compare
            flat[path] = draw.normal(0, 0.3, flat[path].shape).astype(np.float32)
    params = _unflatten(flat)

    peft_model = peft.get_peft_model(
        clf.train(False),
        peft.LoraConfig(
            task_type="SEQ_CLS",
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=TARGETS.split(","),
        ),
    )
    ours_by_key = {weights.hf_key(path[1:], name): (path, value) for path, value in flat.items()
                   if path[-1] in ("lora_a", "lora_b")}  # fmt: skip
    theirs = dict(peft_model.named_parameters())
    adapters = {n: p for n, p in theirs.items() if ".lora_" in n}
    assert len(adapters) == len(ours_by_key) == 2 * 7 * config.num_hidden_layers
    with torch.no_grad():
        for n, p in adapters.items():
            p.copy_(torch.from_numpy(ours_by_key[peft_key(n).removeprefix("model.")][1].T.copy()))
    head = next(p for n, p in theirs.items() if n.endswith("score.modules_to_save.default.weight"))
    assert np.allclose(head.detach().numpy(), flat[("score", "kernel")].T)

    trained, frozen = steps.split_trained(params)
    assert set(_flatten(trained)) == {p for p in flat if p[-1] in ("lora_a", "lora_b")} | {
        ("score", "kernel")
    }
    texts = read_comments(SAMPLE_CSV).texts[:40:4]
    labels = (np.arange(len(texts)) % 2).astype(np.float32)
    for side in ("right", "left"):
        tok.padding_side = side
        batch = tok(
            texts, max_length=40, truncation=True, padding="max_length", return_tensors="np"
        )
        ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
        assert (mask.sum(1) < 40).any() and (mask.sum(1) == 40).any()

        def loss(p, ids=ids, mask=mask):
            logits = model.module.apply({"params": steps.merge_trained(p, frozen)}, ids, mask)
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean(), logits

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(trained)
        peft_model.zero_grad()
        out = peft_model(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()
        )
        torch.nn.functional.binary_cross_entropy_with_logits(
            out.logits[:, 0], torch.from_numpy(labels)
        ).backward()
        ref = out.logits[:, 0].detach().numpy()
        # within 1e-5 of the logits' scale, as the families' forward check measures
        assert np.abs(np.asarray(logits) - ref).max() < 1e-5 * np.abs(ref).max(), side
        ours_grads = _flatten(grads)
        worst = 0.0
        for n, p in adapters.items():
            g = np.asarray(ours_grads[ours_by_key[peft_key(n).removeprefix("model.")][0]]).T
            ref = p.grad.numpy()
            worst = max(worst, np.abs(g - ref).max() / np.abs(ref).max())
        g_head = np.asarray(ours_grads[("score", "kernel")]).T
        worst = max(
            worst, np.abs(g_head - head.grad.numpy()).max() / np.abs(head.grad.numpy()).max()
        )
        assert worst < 1e-4, (side, worst)
        # the base is frozen on peft's side too: no gradient reaches it
        assert all(p.grad is None for n, p in theirs.items() if not p.requires_grad)


@pytest.mark.model
def test_a_lora_state_has_no_optimizer_state_and_bf16_kernels_for_the_frozen_base(tmp_path):
    import jax
    import optax

    from jaxtpu.engine import steps, weights
    from parity_tests.families import build

    base = build("qwen3", tmp_path / "base")
    cfg = Config().replace(model_dir=str(base), head="hf", precision="bf16", lora_rank=4)
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec)
    flat = _flatten(model.params)
    kernels = [p for p in flat if p[-1] == "kernel" and p[0] == "bert"]
    assert kernels and all(flat[p].dtype == jax.numpy.bfloat16 for p in kernels)
    assert flat[("bert", "embed_tokens", "embedding")].dtype == np.float32
    assert all(flat[p].dtype == np.float32 for p in flat if p[-1] in ("lora_a", "lora_b"))
    assert not np.any(np.asarray([np.any(flat[p]) for p in flat if p[-1] == "lora_b"]))
    state = steps.create_state(model.module.apply, model.params, optax.adamw(1e-3))
    moments = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state))
    trained = sum(x.size for x in jax.tree_util.tree_leaves(steps.split_trained(model.params)[0]))
    assert moments == 2 * trained + 1  # mu and nu of what trains, and the count
    everything = sum(x.size for x in jax.tree_util.tree_leaves(model.params))
    assert trained < everything / 4


def _flatten(tree, prefix=()):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _unflatten(flat):
    tree = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree
