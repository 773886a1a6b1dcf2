"""Worker: logits, gradients and every layer's output of one framework on a fixed batch.

`python -m parity_tests.forward --side {jax,xla,hf} --model-dir DIR --csv FILE --out OUT.npz`
runs in its own process (JAX and torch_xla must not share one) and writes `logits`, the
encoder's last hidden state `hidden`, the vector the head reads `pooled` (the family's default
pooling) and the batch's `attention_mask`; with
`--grads`, `grad/<Hugging Face key>` for every parameter, from the mean BCE loss on the batch
(in fp16 scaled by `LOSS_SCALE` and unscaled, as fp16 training does);
with `--capture`, `act/<point>` for every point of `capture_points` (the bisection's layers).
Dropout is off (`deterministic` / `eval()`), so the three sides compute the same function.
`--plant-fault KIND:LAYER` plants a known porting bug in one layer of the JAX side (see
`FAULTS`), to show that `parity_tests.bisect` finds it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import numpy as np

from jaxtpu.core.data.readers import read_comments
from jaxtpu.core.data.tokens import load_tokenizer, tokenize
from jaxtpu.core.hf.encoder import EncoderConfig, read_encoder
from jaxtpu.core.hf.families import get_family, rename
from jaxtpu.core.hf.modelspec import ModelSpec

FAULTS = {
    "ln-eps": "the layer's output LayerNorm with epsilon 1e-3 instead of the checkpoint's",
    "gelu-tanh": "the layer's feed-forward with the tanh approximation of GELU (HF: exact erf)",
    "transposed-kernel": "the layer's attention query kernel loaded without the transpose",
}
FAULT_LN_EPS = 1e-3
# fp16 gradients are taken of the loss times GradScaler's initial scale and divided back, as
# fp16 training takes them (unscaled, the small ones underflow in fp16's backward pass).
LOSS_SCALE = {"fp16": 2.0**16}


def capture_points(enc: EncoderConfig) -> list[str]:
    """The outputs compared layer by layer, in forward order, as jaxtpu's module names
    (`BertModel`'s, or those of `ModernBertModel` and `EuroBertModel` with layers
    `encoder.layer.{i}`; `torch_module` gives the family's own)."""
    first, per_layer, last = enc.family.kind.capture  # the layer kind's record says
    n = enc.num_hidden_layers
    layers = [f"encoder.layer.{i}" + (f".{m}" if m else "") for i in range(n) for m in per_layer]
    if not last and enc.family.pooler:
        last = "pooler"
    return [first, *layers, *([last] if last else []), "classifier"]


# DistilBERT's modules whose outputs are BERT's capture points (the attention block after its
# LayerNorm, the feed-forward activation, the layer output); other families use BERT's names.
_DISTILBERT_POINTS = {
    "attention": "transformer.layer.{i}.sa_layer_norm",
    "intermediate": "transformer.layer.{i}.ffn.activation",
    "output": "transformer.layer.{i}.output_layer_norm",
}


def torch_module(point: str, model_type: str) -> str:
    """The torch Classifier's module whose output is capture point `point`."""
    if point == "classifier":
        return point
    if get_family(model_type).kind.renamed_capture:
        return "bert." + rename(get_family(model_type), point)
    m = re.fullmatch(r"encoder\.layer\.(\d+)\.(\w+)", point)
    if model_type == "distilbert" and m:
        return "bert." + _DISTILBERT_POINTS[m.group(2)].format(i=m.group(1))
    return f"bert.{point}"


def batch(csv: str, model_dir: str, n: int, max_len: int):
    comments = read_comments(csv)
    tokenizer = load_tokenizer(model_dir)
    ids, mask, _ = tokenize(comments.texts[:n], tokenizer, max_len)
    return ids, mask, comments.labels[:n]


def encoder(model_dir: str) -> EncoderConfig:
    return read_encoder(model_dir)


def parse_fault(fault: str, num_layers: int) -> tuple[str, int]:
    """`KIND:LAYER` -> (kind, layer), or ValueError saying what is wrong."""
    kind, _, layer = fault.partition(":")
    if kind not in FAULTS or not layer.isdigit():
        raise ValueError(f"--plant-fault {fault}: expected KIND:LAYER, KIND one of {list(FAULTS)}")
    if int(layer) >= num_layers:
        raise ValueError(f"--plant-fault {fault}: the model has layers 0..{num_layers - 1}")
    return kind, int(layer)


def _flax_path(point: str) -> tuple[str, ...]:
    """'encoder.layer.3.output' -> ('bert', 'encoder', 'layer_3', 'output'); the same for
    ModernBERT's points."""
    parts = tuple(re.sub(r"layer\.(\d+)", r"layer_\1", point).split("."))
    return parts if point == "classifier" else ("bert", *parts)


def _planted(fault: str, params, num_layers: int):
    """(params, interceptor) of a planted fault `KIND:LAYER` on the JAX side."""
    import jax
    import jax.numpy as jnp

    try:
        kind, layer = parse_fault(fault, num_layers)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    where = ("bert", "encoder", f"layer_{layer}")
    if kind == "transposed-kernel":
        query = params["bert"]["encoder"][where[2]]["attention"]["self"]["query"]
        query["kernel"] = np.ascontiguousarray(query["kernel"].T)
        return params, None

    def interceptor(next_fun, args, kwargs, context):
        module, path = context.module, context.module.path
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        p = module.variables.get("params", {})
        if kind == "ln-eps" and path == (*where, "output", "LayerNorm"):
            x = args[0]
            mean = x.mean(-1, keepdims=True)
            var = jnp.square(x - mean).mean(-1, keepdims=True)
            return (x - mean) * jax.lax.rsqrt(var + FAULT_LN_EPS) * p["scale"] + p["bias"]
        if kind == "gelu-tanh" and path == (*where, "intermediate"):
            dense = p["dense"]
            y = args[0].astype(jnp.float32) @ dense["kernel"] + dense["bias"]
            return jax.nn.gelu(y, approximate=True).astype(module.dtype)
        return next_fun(*args, **kwargs)

    return params, interceptor


def run_jax(args, ids, mask, labels) -> dict[str, np.ndarray]:
    import contextlib

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    from jaxtpu.engine import hosts, weights
    from jaxtpu.models import encoder as models
    from jaxtpu.models import head

    hosts.full_fp32_matmuls(jax.devices()[0].platform)  # as training sets it
    enc = encoder(args.model_dir)
    module = models.create_module(ModelSpec(enc, precision=args.precision))
    template = models.init_params(module, ids.shape[1:], 0)
    params, kept = weights.load_params(
        args.model_dir, template, head_required=True, model_type=enc.model_type
    )
    assert not kept, kept
    interceptor = None
    if args.plant_fault:
        if enc.family.kind.name != "bert":
            raise SystemExit(f"--plant-fault: the faults are BERT-layer ones, not {enc.model_type}")
        params, interceptor = _planted(args.plant_fault, params, enc.num_hidden_layers)
    points = {_flax_path(p): p for p in capture_points(enc)}
    wanted = {*points, ("bert",)}
    scale = LOSS_SCALE.get(args.precision, 1.0)

    def loss_fn(p):
        logits, state = module.apply(
            {"params": p},
            ids,
            mask,
            deterministic=True,
            capture_intermediates=lambda m, name: name == "__call__" and m.path in wanted,
            mutable=["intermediates"],
        )
        loss = optax.sigmoid_binary_cross_entropy(logits, jnp.asarray(labels)).mean()
        return loss * scale, (logits, state["intermediates"])

    intercept = nn.intercept_methods(interceptor) if interceptor else contextlib.nullcontext()
    # jitted, as training runs it: op by op, XLA:CPU has no kernel for some of the 16-bit
    # backward's matmuls (DeBERTa's relative terms: "Unsupported element type for DotThunk")
    with intercept:
        (_, (logits, captured)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    hidden, pooler = captured["bert"]["__call__"][0]
    out = {
        "logits": np.asarray(logits, np.float32),
        "hidden": np.asarray(hidden, np.float32),
        "pooled": np.asarray(
            head.pool(module.pooling, hidden, pooler, mask, ids, enc.pad_token_id), np.float32
        ),
    }
    if args.capture:
        for path, point in points.items():
            node = captured
            for name in path:
                node = node[name]
            out[f"act/{point}"] = np.asarray(node["__call__"][0], np.float32)
    if args.grads:
        grads = jax.tree_util.tree_map(lambda g: g / scale, grads)
        encoder_grads, head = weights.to_state_dicts(jax.device_get(grads), enc.model_type)
        out.update({f"grad/{k}": v for k, v in {**encoder_grads, **head}.items()})
    return out


def run_torch(args, ids, mask, labels, device_kind: str) -> dict[str, np.ndarray]:
    import torch

    from torchxla_ref import steps, weights
    from torchxla_ref.models import pool

    enc = encoder(args.model_dir)
    if device_kind == "xla":
        import torch_xla

        device = torch_xla.device()
    else:
        device = torch.device(device_kind)  # cpu, or cuda (plain torch on a GPU)
    model = weights.load_model(ModelSpec(enc), args.model_dir, 0).to(device).eval()
    scale = LOSS_SCALE.get(args.precision, 1.0)
    captured = {}
    encoded = {}
    model.bert.register_forward_hook(lambda _m, _i, output: encoded.update(out=output))
    if args.capture:
        modules = dict(model.named_modules())
        for point in capture_points(enc):
            name = torch_module(point, enc.model_type)

            def hook(_module, _inputs, output, point=point):
                captured[point] = output[0] if isinstance(output, tuple) else output

            modules[name].register_forward_hook(hook)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    with steps.autocast(args.precision, device_kind):
        logits = model(t(ids), t(mask))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), t(labels))
    (loss * scale).backward()
    if device_kind == "xla":
        import torch_xla

        torch_xla.sync()  # one graph for logits and every gradient; then only transfers
    numpy = lambda x: x.detach().float().cpu().numpy()  # noqa: E731
    pooled = pool(model.pooling, encoded["out"], t(mask), t(ids), enc.pad_token_id)
    out = {
        "logits": numpy(logits),
        "hidden": numpy(encoded["out"].last_hidden_state),
        "pooled": numpy(pooled),
    }
    for point, value in captured.items():
        out[f"act/{point}"] = value.detach().float().cpu().numpy()
    if args.grads:
        for name, p in model.named_parameters():
            grad = p.grad.detach().float() / scale
            out[f"grad/{name.removeprefix('bert.')}"] = grad.cpu().numpy()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity_tests.forward", description=__doc__)
    p.add_argument(
        "--side",
        choices=("jax", "xla", "hf", "cuda"),
        required=True,
        help="jax; xla (torch_xla's device); hf (plain torch on the CPU); cuda (plain torch on "
        "the first GPU)",
    )
    p.add_argument("--model-dir", required=True, help="HF directory with head.safetensors")
    p.add_argument("--csv", required=True, help="labelled classification CSV (real comments)")
    p.add_argument("--n", type=int, default=16, help="comments in the batch")
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument(
        "--precision",
        default="fp32",
        help="fp32, bf16, fp16, or several as 'fp32,bf16': one process computes each in turn "
        "and writes --out with {precision} replaced (what a second process would cost is its "
        "start: JAX or torch and transformers imported again)",
    )
    p.add_argument("--grads", action="store_true", help="also write the gradients")
    p.add_argument("--capture", action="store_true", help="also write every layer's output")
    p.add_argument(
        "--plant-fault",
        metavar="KIND:LAYER",
        help=f"jax side: plant a porting bug in one layer; KIND one of {', '.join(FAULTS)}",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    precisions = args.precision.split(",")
    if not set(precisions) <= {"fp32", "bf16", "fp16"} or len(set(precisions)) != len(precisions):
        p.error(f"--precision {args.precision}: one or more of fp32, bf16, fp16")
    if len(precisions) > 1 and "{precision}" not in args.out:
        p.error("--out must contain {precision} when --precision names several")
    ids, mask, labels = batch(args.csv, args.model_dir, args.n, args.max_len)
    if args.side == "xla":
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        os.environ.setdefault("CPU_NUM_DEVICES", "1")
    for precision in precisions:
        one = argparse.Namespace(**{**vars(args), "precision": precision})
        if args.side == "jax":
            out = run_jax(one, ids, mask, labels)
        else:
            kind = {"xla": "xla", "hf": "cpu", "cuda": "cuda"}[args.side]
            out = run_torch(one, ids, mask, labels, kind)
        np.savez(args.out.format(precision=precision), attention_mask=mask, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
