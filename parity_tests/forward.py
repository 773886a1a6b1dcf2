"""Worker: logits (and fp32 gradients) of one framework on a fixed batch of real comments.

`python -m parity_tests.forward --side {jax,xla,hf} --model-dir DIR --csv FILE --out OUT.npz`
runs in its own process (JAX and torch_xla must not share one) and writes `logits` and, with
`--grads`, `grad/<Hugging Face key>` for every parameter, from the mean BCE loss on the batch.
Dropout is off (`deterministic` / `eval()`), so the three sides compute the same function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from jaxtpu.core.config import EncoderConfig
from jaxtpu.core.data import read_comments
from jaxtpu.core.tokens import load_tokenizer, tokenize


def batch(csv: str, model_dir: str, n: int, max_len: int):
    comments = read_comments(csv)
    tokenizer = load_tokenizer(model_dir)
    ids, mask, _ = tokenize(comments.texts[:n], tokenizer, max_len)
    return ids, mask, comments.labels[:n]


def run_jax(args, ids, mask, labels) -> dict[str, np.ndarray]:
    import jax
    import jax.numpy as jnp
    import optax

    from jaxtpu import models, weights

    enc = EncoderConfig.from_hf_dict(
        __import__("json").loads(open(os.path.join(args.model_dir, "config.json")).read())
    )
    module = models.create_module(enc, 0.0, args.precision)
    template = models.init_params(module, ids.shape[1:], 0)
    params, kept = weights.load_params(args.model_dir, template, head_required=True)
    assert not kept, kept

    def loss_fn(p):
        logits = module.apply({"params": p}, ids, mask, deterministic=True)
        return optax.sigmoid_binary_cross_entropy(logits, jnp.asarray(labels)).mean(), logits

    (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    out = {"logits": np.asarray(logits, np.float32)}
    if args.grads:
        encoder, head = weights.to_state_dicts(jax.device_get(grads))
        out.update({f"grad/{k}": v for k, v in {**encoder, **head}.items()})
    return out


def run_torch(args, ids, mask, labels, device_kind: str) -> dict[str, np.ndarray]:
    import torch

    from torchxla_ref import steps, weights

    enc = EncoderConfig.from_hf_dict(
        __import__("json").loads(open(os.path.join(args.model_dir, "config.json")).read())
    )
    if device_kind == "xla":
        import torch_xla

        device = torch_xla.device()
    else:
        device = torch.device("cpu")
    model = weights.load_model(enc, 0.0, args.model_dir, 0).to(device).eval()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    with steps.autocast(args.precision, device_kind):
        logits = model(t(ids), t(mask))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), t(labels))
    loss.backward()
    if device_kind == "xla":
        import torch_xla

        torch_xla.sync()  # one graph for logits and every gradient; then only transfers
    out = {"logits": logits.detach().float().cpu().numpy()}
    if args.grads:
        for name, p in model.named_parameters():
            out[f"grad/{name.removeprefix('bert.')}"] = p.grad.detach().float().cpu().numpy()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity_tests.forward", description=__doc__)
    p.add_argument("--side", choices=("jax", "xla", "hf"), required=True)
    p.add_argument("--model-dir", required=True, help="HF directory with head.safetensors")
    p.add_argument("--csv", required=True, help="labelled classification CSV (real comments)")
    p.add_argument("--n", type=int, default=16, help="comments in the batch")
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--grads", action="store_true", help="also write fp32 gradients")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    ids, mask, labels = batch(args.csv, args.model_dir, args.n, args.max_len)
    if args.side == "jax":
        out = run_jax(args, ids, mask, labels)
    else:
        if args.side == "xla":
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            os.environ.setdefault("CPU_NUM_DEVICES", "1")
        out = run_torch(args, ids, mask, labels, args.side if args.side == "xla" else "cpu")
    np.savez(args.out, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
