"""LoRA on the decoders: jaxtpu's adapters against peft's own (`LoraConfig`,
`get_peft_model` on transformers' `*ForSequenceClassification`), forward and the gradients of
what trains, in fp32, with right and left padding; what trains and what is frozen (no
gradient, no optimizer state, bf16 kernels); the flags' refusals. The LoRA training
trajectory against torch_xla is `parity_tests` ("trajectory qwen3 lora")."""

from __future__ import annotations

import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.readers import read_comments
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.hf.modelspec import ModelSpec
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


def test_an_adapter_jaxtpu_cannot_continue_is_refused_in_one_line(tmp_path):
    import json

    from safetensors.numpy import save_file

    from jaxtpu.core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_dir, read_adapter

    good = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    refusals = [
        ({**good, "use_dora": True}, "use_dora"),
        ({**good, "rank_pattern": {"q_proj": 8}}, "rank_pattern"),
        ({**good, "bias": "all"}, "bias 'all'"),
        ({**good, "target_modules": "q_proj|v_proj"}, "a list of module names"),
        ({**good, "peft_type": "IA3"}, "peft_type 'IA3'"),
    ]
    for config, message in refusals:
        (tmp_path / ADAPTER_CONFIG).write_text(json.dumps(config))
        with pytest.raises(ConfigError, match=message):
            read_adapter(str(tmp_path))
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps(good))
    assert is_adapter_dir(str(tmp_path)) and not is_adapter_dir(str(tmp_path / "none"))
    with pytest.raises(ConfigError, match=f"no {ADAPTER_WEIGHTS}"):
        read_adapter(str(tmp_path))
    save_file({"base_model.model.score.weight": np.ones((1, 4), np.float32)},
              str(tmp_path / ADAPTER_WEIGHTS))  # fmt: skip
    spec, tensors = read_adapter(str(tmp_path))
    assert spec == LoraSpec(4, 8.0, 0.0, ("q_proj",)) and list(tensors) == [
        "base_model.model.score.weight"
    ]


@pytest.mark.model
@pytest.mark.torch  # peft imports accelerate, which imports torch_xla
@pytest.mark.parametrize("name", ["qwen3", "qwen2"])  # Qwen2: the q/k/v biases too
def test_lora_matches_peft_forward_and_gradients_in_fp32(name, tmp_path):
    """`parity_tests.lora`: logits and the gradients of every adapter and of the head against
    peft on transformers' own classifier, right and left padding."""
    pytest.importorskip("peft")
    from parity_tests.lora import forward_and_gradients

    results = forward_and_gradients(tmp_path, name)
    assert len(results) == 4
    assert all(r.passed for r in results), [(r.check, r.measured, r.detail) for r in results]


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
    flat = flatten_dict(model.params)
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


@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.torch  # peft imports accelerate, which imports torch_xla
def test_a_lora_run_exports_a_peft_adapter_and_a_merged_model_that_score_as_it_does(tmp_path):
    """Train a Qwen3 LoRA run (fp32, 6 steps), score it with jaxtpu, export it as a peft
    adapter and merged: peft's `PeftModel.from_pretrained` on transformers' classifier of the
    base, and transformers' classifier of the merged directory, give jaxtpu's logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import json

    import jax

    import jaxtpu
    from jaxtpu import export
    from parity_tests.families import build
    from tests.helpers import cli

    base = build("qwen3", tmp_path / "base")
    wd = tmp_path / "run"
    flags = ["--model-dir", base, "--head", "hf", "--lora-rank", "4", "--lora-dropout", "0.1"]
    flags += ["--precision", "fp32", "--max-len", "32", "--max-rows", "300", "--max-steps", "6"]
    proc = cli("jaxtpu.train", *flags, "--workdir", wd, "--lr", "1e-3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert "LoRA r=4 alpha=8 dropout=0.1 on q_proj,k_proj,v_proj,o_proj,gate_proj" in said
    # what trains: per layer r x (in + out) of q 32->64, k and v 32->32, o 64->32, gate and
    # up 32->48, down 48->32 (4 x 560 = 2,240), two layers, and the head's 32 weights
    assert "4,512 params train" in said, said[-2000:]
    texts = read_comments(SAMPLE_CSV).texts[:12] + ["ok"]
    ours = jaxtpu.load(wd, num_devices=1).logits(texts)

    assert export.main(["--workdir", str(wd), "--out", str(tmp_path / "adapter")]) == 0
    assert export.main(["--workdir", str(wd), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["modules_to_save"]) == (4, 8.0, ["score"])
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "adapter"))
    batch = tok(texts, max_length=32, truncation=True, padding=True, return_tensors="pt")
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1)
    adapted = peft.PeftModel.from_pretrained(plain, str(tmp_path / "adapter")).eval()
    merged = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "merged")
    ).eval()
    with torch.no_grad():
        theirs = adapted(**batch).logits[:, 0].double().numpy()
        merged_logits = merged(**batch).logits[:, 0].double().numpy()
    assert np.abs(ours - theirs).max() < 1e-5 * max(1.0, np.abs(theirs).max())
    assert np.abs(merged_logits - theirs).max() < 1e-5 * max(1.0, np.abs(theirs).max())
    # the adapters trained: without them, the base with the trained head scores otherwise
    with adapted.disable_adapter(), torch.no_grad():
        bare = adapted(**batch).logits[:, 0].double().numpy()
    assert np.abs(bare - theirs).max() > 1e-3

    # --init-from the adapter continues from it, on both sides: before any step, the run's
    # logits (the refusal first: the adapter's own LoRA settings are asked for)
    from jaxtpu.engine import weights
    from torchxla_ref.weights import load_model

    again = Config().replace(
        model_dir=str(base), init_from=str(tmp_path / "adapter"), head="hf", precision="fp32"
    )
    with pytest.raises(ConfigError, match="continue it with --lora-rank 4 --lora-alpha 8"):
        RunSpec.resolve(again.replace(lora_rank=8), 1)
    again = again.replace(lora_rank=4, lora_alpha=8.0, max_len=32, seed=3)  # another seed's A
    spec = RunSpec.resolve(again, 1)
    assert spec.weights == str(base) and spec.adapter == str(tmp_path / "adapter")
    start = weights.load_model(again, spec)
    ids = batch["input_ids"].numpy().astype(np.int32)
    mask = batch["attention_mask"].numpy().astype(np.int32)
    jax_start = np.asarray(jax.jit(start.module.apply)({"params": start.params}, ids, mask))
    assert np.abs(jax_start - theirs).max() < 1e-5 * max(1.0, np.abs(theirs).max())
    mine = ModelSpec(spec.encoder, pooling="last", head="hf", lora=spec.lora, adapter=spec.adapter)
    twin = load_model(mine, spec.weights, 3).eval()
    with torch.no_grad():
        torch_start = twin(torch.from_numpy(ids), torch.from_numpy(mask)).double().numpy()
    assert np.abs(torch_start - theirs).max() < 1e-5 * max(1.0, np.abs(theirs).max())


@pytest.mark.model
@pytest.mark.torch  # peft imports accelerate, which imports torch_xla
def test_layer_rates_of_the_adapters_are_the_same_on_both_sides(tmp_path):
    """--layer-lr-decay under LoRA: each adapter's rate multiplier on the JAX side equals its
    parameter group's on the torch side (peft's names, read as their plain keys), and the
    frozen base has no group."""
    pytest.importorskip("peft")
    from jaxtpu.core.lora import peft_key
    from jaxtpu.core.schedules import Horizon, peak_lr
    from jaxtpu.engine import weights
    from parity_tests.families import build
    from torchxla_ref import optim
    from torchxla_ref.weights import load_model

    base = build("qwen3", tmp_path / "base")
    cfg = Config().replace(model_dir=str(base), head="hf", lora_rank=4, layer_lr_decay=0.5)
    spec = RunSpec.resolve(cfg, 1)
    ours = {
        weights.hf_key(path[1:] if path[0] == "bert" else path, "qwen3"): float(scale)
        for path, scale in flatten_dict(weights.load_model(cfg, spec).lr_scales).items()
        if path[-1] in ("lora_a", "lora_b") or path[0] != "bert"
    }
    model = load_model(
        ModelSpec(spec.encoder, pooling="last", head="hf", lora=spec.lora), spec.weights, 0
    )
    opt, _ = optim.make_optimizer(model, cfg.optim, Horizon(10, 10), 1)
    name = {id(p): n for n, p in model.named_parameters()}
    theirs = {
        peft_key(name[id(p)].removeprefix("bert.").removeprefix("head.")): g["initial_lr"]
        / peak_lr(cfg.optim, 1)
        for g in opt.param_groups
        for p in g["params"]
    }
    assert set(ours) == set(theirs) and len(ours) == 29  # 28 adapters and the head, no base
    assert {round(v, 6) for v in ours.values()} == {0.5, 1.0}  # layer 0, layer 1 and head
    assert all(abs(ours[k] - theirs[k]) < 1e-6 for k in ours), (ours, theirs)


def test_peft_target_modules_are_read_as_peft_reads_them():
    """Issue 67, item 5: peft writes `all-linear` out as every projection's full name in
    every layer; the names, their suffixes and the shorthand name the same --lora-targets."""
    from jaxtpu.core.hf.kinds import DECODER_PROJECTIONS as DENSE
    from jaxtpu.core.lora import peft_targets

    mlp = ("gate_proj", "up_proj", "down_proj")
    full = [
        f"model.layers.{i}.{'mlp' if p in mlp else 'self_attn'}.{p}"
        for i in range(2)
        for p in reversed(DENSE)
    ]
    assert peft_targets(full, DENSE, 2, "x") == DENSE
    assert peft_targets(["all-linear"], DENSE, 2, "x") == DENSE
    assert peft_targets(["v_proj", "self_attn.q_proj"], DENSE, 2, "x") == ("q_proj", "v_proj")
    with pytest.raises(ConfigError, match=r"adapt q_proj in layers \[0\] of 2"):
        peft_targets(["model.layers.0.self_attn.q_proj"], DENSE, 2, "x")
    with pytest.raises(ConfigError, match="'lm_head' is not a dense layer"):
        peft_targets(["q_proj", "lm_head"], DENSE, 2, "x")


def test_an_all_linear_adapter_is_continued_with_the_advised_flags(tmp_path):
    """The advice --init-from gives for an `all-linear` adapter is followed, not refused."""
    import json

    from safetensors.numpy import save_file

    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.hf.kinds import DECODER_PROJECTIONS as DENSE
    from jaxtpu.core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    base = tmp_path / "base"
    base.mkdir()
    config = {"model_type": "qwen3", "pad_token_id": 0, "vocab_size": 50, "hidden_size": 32}
    config |= {"num_attention_heads": 4, "num_hidden_layers": 2}
    (base / "config.json").write_text(json.dumps(config))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    names = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in DENSE]
    peft = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": names}
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(peft))
    save_file({"base_model.model.score.weight": np.ones((1, 32), np.float32)},
              str(adapter / ADAPTER_WEIGHTS))  # fmt: skip
    cfg = Config().replace(model_dir=str(base), init_from=str(adapter), head="hf", lora_rank=4)
    with pytest.raises(ConfigError, match=f"--lora-targets {','.join(DENSE)}$") as advice:
        RunSpec.resolve(cfg.replace(lora_targets="q_proj,v_proj"), 1)
    assert "model.layers" not in str(advice.value)
    spec = RunSpec.resolve(cfg.replace(lora_targets=",".join(DENSE)), 1)  # the advice, followed
    assert spec.lora == LoraSpec(4, 8.0, 0.0, DENSE)


def test_resume_compares_lora_flags_by_what_they_resolve_to():
    """Issue 67, item 6: --lora-alpha 8 is the default alpha (-1: 2 x rank 4) the run used."""
    from jaxtpu.core.flags.schema import changed_flags

    run = Config().replace(lora_rank=4, lora_targets="q_proj,v_proj").to_dict()
    assert (
        changed_flags(
            run, Config().replace(lora_rank=4, lora_targets="q_proj,v_proj", lora_alpha=8)
        )
        == []
    )
    assert changed_flags(run, Config().replace(lora_rank=4, lora_targets="v_proj,q_proj")) == []
    moved = changed_flags(
        run, Config().replace(lora_rank=4, lora_targets="q_proj,v_proj", lora_alpha=16)
    )
    assert [name for name, _, _ in moved] == ["lora_alpha"]
