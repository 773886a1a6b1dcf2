"""LoRA against peft, in one process: jaxtpu's adapters (`jaxtpu.models.layers.LoraDense`) and
peft's own (`LoraConfig`, `get_peft_model` with task_type SEQ_CLS on transformers'
`*ForSequenceClassification` of a decoder's test checkpoint), both given the same nonzero A
and B on every projection (B starts at zero, where A gets no gradient and the adapters change
nothing): the logits, and the gradient of every adapter and of the head, in fp32, with right
and left padding, on prompts (`--prompt-template`, through the test tokenizer's chat
template; the instructions longer than the shortest comments). `tests/test_lora.py` runs it;
the report's step "lora: forward + gradients" prints its numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity_tests.checks import RULES_PROMPT, Result

RANK, ALPHA = 4, 8.0
RULES = ("No spam.", "No insults or personal attacks.")
FORWARD_RTOL = 1e-5  # of the logits' scale, as the families' forward check measures
GRAD_RTOL = 1e-4  # per tensor, of its largest entry


def forward_and_gradients(work: Path, family: str) -> list[Result]:
    import jax
    import optax
    import torch

    from jaxtpu.core.data.demo import SAMPLE_CSV
    from jaxtpu.core.data.readers import read_comments
    from jaxtpu.core.data.templates import PromptTemplate
    from jaxtpu.core.data.tokens import encode_texts
    from jaxtpu.engine import steps

    clf_dir, clf, tok = _classifier(work, family)
    model, flat, trained, frozen = _jax_model(clf_dir)
    reference, theirs, ours_of = _peft_reference(clf, flat, family)
    # prompts, as a rules run reads them: the chat template's tokens of each, the comment cut
    # at 128 tokens; the instructions are longer than the shortest comments
    texts = read_comments(SAMPLE_CSV).texts[:40:4]
    prompt = PromptTemplate(RULES_PROMPT, rules=True)
    items = [(prompt.render({"rule": RULES[k % 2]}), t) for k, t in enumerate(texts)]
    labels = (np.arange(len(texts)) % 2).astype(np.float32)
    results = []
    for side in ("right", "left"):
        tok.padding_side = side
        ids, mask = encode_texts(items, tok, 128, "prompt")

        def loss(p, ids=ids, mask=mask):
            logits = model.module.apply({"params": steps.merge_trained(p, frozen)}, ids, mask)
            return optax.sigmoid_binary_cross_entropy(logits, labels).mean(), logits

        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trained)
        reference.zero_grad()
        out = reference(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()
        )
        torch.nn.functional.binary_cross_entropy_with_logits(
            out.logits[:, 0], torch.from_numpy(labels)
        ).backward()
        ref = out.logits[:, 0].detach().numpy()
        d = float(np.abs(np.asarray(logits) - ref).max() / np.abs(ref).max())
        results.append(
            Result(
                f"lora {family} forward fp32, {side} padding: jaxtpu vs peft",
                FORWARD_RTOL,
                d,
                d <= FORWARD_RTOL,
                "max |logit difference| / max |logit|",
            )
        )
        results.append(_gradients(family, side, grads, theirs, ours_of))
    return results


def _classifier(work: Path, family: str):
    """(directory, torch classifier, tokenizer): a decoder family's test checkpoint as a
    *ForSequenceClassification with a nonzero score head, saved."""
    import torch
    import transformers

    from parity_tests.families import build

    base = build(family, work / f"lora-{family}-base")
    clf_dir = work / f"lora-{family}-clf"
    config = transformers.AutoConfig.from_pretrained(str(base))
    config.num_labels = 1
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_config(config)
    clf.model.load_state_dict(transformers.AutoModel.from_pretrained(str(base)).state_dict())
    with torch.no_grad():
        clf.score.weight.normal_(0, 0.5)
    clf.save_pretrained(str(clf_dir))
    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.save_pretrained(str(clf_dir))
    return clf_dir, clf, tok


def _jax_model(clf_dir: Path):
    """(model, its flat params, trained, frozen): jaxtpu's LoRA model of the classifier, each
    adapter's B drawn nonzero so that A has a gradient to compare."""
    from flax.traverse_util import flatten_dict, unflatten_dict

    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.core.flags.schema import Config
    from jaxtpu.engine import steps, weights

    cfg = Config().replace(
        model_dir=str(clf_dir), head="hf", precision="fp32", max_len=40, lora_rank=RANK
    )
    cfg = cfg.replace(lora_alpha=ALPHA)
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    flat = {k: np.asarray(v) for k, v in flatten_dict(model.params).items()}
    draw = np.random.default_rng(7)
    for path in flat:
        if path[-1] == "lora_b":  # nonzero, so that A has a gradient to compare
            flat[path] = draw.normal(0, 0.3, flat[path].shape).astype(np.float32)
    trained, frozen = steps.split_trained(unflatten_dict(flat))
    return model, flat, trained, frozen


def _peft_reference(clf, flat: dict, family: str):
    """(peft model, its named parameters, peft name -> jaxtpu path): peft's LoRA of the same
    classifier, its adapters and head set to jaxtpu's values."""
    import peft
    import torch

    from jaxtpu.core.hf.kinds import DECODER_PROJECTIONS
    from jaxtpu.core.lora import peft_key
    from jaxtpu.engine import weights

    reference = peft.get_peft_model(
        clf.train(False),
        peft.LoraConfig(
            task_type="SEQ_CLS",
            r=RANK,
            lora_alpha=ALPHA,
            lora_dropout=0.0,
            target_modules=list(DECODER_PROJECTIONS),
        ),
    )
    theirs = dict(reference.named_parameters())
    ours_of = {  # peft's parameter name -> jaxtpu's path
        name: _path(weights, flat, peft_key(name).removeprefix("model."), family)
        for name in theirs
        if ".lora_" in name
    }
    head = next(n for n in theirs if n.endswith("score.modules_to_save.default.weight"))
    ours_of[head] = ("score", "kernel")
    with torch.no_grad():
        for name, path in ours_of.items():
            theirs[name].copy_(torch.from_numpy(flat[path].T.copy()))
    return reference, theirs, ours_of


def _gradients(family: str, side: str, grads, theirs: dict, ours_of: dict) -> Result:
    """The worst relative difference of the trained tensors' gradients; no frozen one has a
    gradient on peft's side, and jaxtpu trains exactly the adapters and head."""
    from flax.traverse_util import flatten_dict

    from jaxtpu.core.lora import peft_key

    ours = flatten_dict(grads)
    frozen_grads = [n for n, p in theirs.items() if not p.requires_grad and p.grad is not None]
    worst, worst_name = 0.0, ""
    for name, path in ours_of.items():
        g, r = np.asarray(ours[path]).T, theirs[name].grad.numpy()
        rel = float(np.abs(g - r).max() / np.abs(r).max())
        if rel > worst:
            worst, worst_name = rel, name
    return Result(
        f"lora {family} gradients fp32, {side} padding: jaxtpu vs peft",
        GRAD_RTOL,
        worst,
        worst <= GRAD_RTOL and len(ours) == len(ours_of) and not frozen_grads,
        f"{len(ours_of)} tensors (adapters, head), worst {peft_key(worst_name)}; "
        f"frozen with a gradient: {len(frozen_grads)}",
    )


def _path(weights, flat: dict, key: str, family: str) -> tuple[str, ...]:
    """jaxtpu's path of the adapter whose Hugging Face key is `key`."""
    for path in flat:
        if path[-1] in ("lora_a", "lora_b") and weights.hf_key(path[1:], family) == key:
            return path
    raise KeyError(key)
