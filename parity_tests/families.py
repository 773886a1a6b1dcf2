"""Small random-init checkpoints of every encoder family, built with transformers' own PyTorch
classes and a tokenizer of the family's kind trained on real comments, for tests that cannot
download a pretrained one.

`python -m parity_tests.families --out DIR [--family NAME ...]` writes `DIR/<family>/`:
`config.json` + `model.safetensors` (`save_pretrained` of the family's `*Model`) and
`tokenizer.json` + `tokenizer_config.json` (a `tokenizers` tokenizer wrapped by transformers'
fast tokenizer): WordPiece for BERT, DistilBERT and ELECTRA, byte-level BPE for RoBERTa,
SentencePiece-style Unigram for XLM-R and DeBERTa-v3, byte-level BPE with BERT's special
tokens for ModernBERT and Llama 3's for EuroBERT, SentencePiece-style BPE with Gemma's special
tokens for mmBERT, with each family's special tokens and padding id.

Every weight is perturbed away from transformers' init (LayerNorms are not 1 and 0, the
weights are wider than 0.02), so a mixed-up tensor or a missing term changes the outputs well
beyond the parity tolerances. DeBERTa uses DeBERTa-v3's options (relative attention with log
buckets, shared keys, LayerNorm'd relative embeddings, no absolute positions), with buckets
small enough that real comments reach the log range. ModernBERT has 3 layers, global,
sliding-window, global (`global_attn_every_n_layers` 2), a window of 16 tokens (8 on each side:
real comments of 64 tokens reach past it) and rotary bases of its own, so both layer kinds and
the window are exercised. EuroBERT has 2 layers with grouped-query attention (2 key/value heads
for 4 query heads), a rotary base of its own and a byte-level BPE tokenizer with Llama 3's
special tokens.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.readers import read_comments

VOCAB = 600
HIDDEN = 32
SHAPE = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_act="gelu",
)

# family -> (tokenizer kind, special tokens in id order, (cls/bos, sep/eos), pad)
TOKENIZERS = {
    "bert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]")),
    "distilbert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]")),
    "electra": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]")),
    "roberta": ("bpe", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], ("<s>", "</s>")),
    "xlm-roberta": ("unigram", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], ("<s>", "</s>")),
    "deberta-v2": ("unigram", ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], ("[CLS]", "[SEP]")),
    "modernbert": ("bpe", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]")),
    "eurobert": (
        "bpe",
        ["<|pad|>", "<|unk|>", "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"],
        ("<|begin_of_text|>", "<|end_of_text|>"),
    ),
}
# The decoders (issue 56): byte-level BPE with Qwen's special tokens (no BOS, `<|endoftext|>`
# pads) and Llama 3's (BOS first, a reserved token pads). Kept apart from FAMILY_NAMES, whose
# every family also goes through the ONNX export tests.
DECODER_TOKENIZERS = {
    "qwen3": (
        "bpe",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>", "<|mask|>"],
        ("", "<|endoftext|>"),
    ),
    "qwen2": (
        "bpe",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>", "<|mask|>"],
        ("", "<|endoftext|>"),
    ),
    "llama": (
        "bpe",
        [
            "<|finetune_right_pad_id|>",
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|eot_id|>",
            "<|unk|>",
            "<|mask|>",
        ],
        ("<|begin_of_text|>", "<|end_of_text|>"),
    ),
}
DECODER_NAMES = tuple(DECODER_TOKENIZERS)
# Chat templates of the decoders' kinds, written for these tests: ChatML as Qwen lays it out
# (Qwen2.5's with the default system message its template adds) and Llama 3's headers, with
# the BOS and the trimmed message its template writes. `--prompt-template` renders through them.
_CHATML = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {
    "qwen3": _CHATML,
    "qwen2": "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a "
    "helpful assistant.<|im_end|>\\n' }}{%- endif %}" + _CHATML,
    "llama": (
        "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
        "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
}
TOKENIZERS.update(DECODER_TOKENIZERS)
FAMILY_NAMES = tuple(k for k in TOKENIZERS if k not in DECODER_TOKENIZERS)
# A second DeBERTa: the options DeBERTa-v3 does not use (separate position projections,
# absolute positions and token types too, no log buckets, a narrower embedding projected up).
# mmBERT: ModernBERT's layers with a Gemma-style SentencePiece BPE vocabulary (its own special
# tokens), the default rotary bases, a layer pattern of every third layer global and CLS pooling.
VARIANTS = {"deberta-v2-unshared": "deberta-v2", "mmbert": "modernbert"}
VARIANT_TOKENIZERS = {
    "mmbert": ("spm-bpe", ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], ("<bos>", "<eos>")),
}


def _config(name: str, pad: int):
    import transformers as t

    common = dict(vocab_size=VOCAB, pad_token_id=pad, initializer_range=0.2)
    if name == "bert":
        return t.BertConfig(**SHAPE, **common, max_position_embeddings=128)
    if name in ("roberta", "xlm-roberta"):
        cls = t.RobertaConfig if name == "roberta" else t.XLMRobertaConfig
        # positions start after the padding index: 128 tokens need 128 + pad + 1 rows
        return cls(**SHAPE, **common, max_position_embeddings=130, type_vocab_size=1)
    if name == "distilbert":
        return t.DistilBertConfig(
            **common, dim=HIDDEN, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128
        )
    if name == "electra":
        return t.ElectraConfig(**SHAPE, **common, embedding_size=16, max_position_embeddings=128)
    if name in ("eurobert", "mmbert", "modernbert"):
        return _prenorm_config(name, common)
    if name in ("qwen3", "qwen2", "llama"):
        return _decoder_config(name, common)
    deberta = dict(**SHAPE, **common, max_position_embeddings=128, relative_attention=True)
    if name == "deberta-v2":  # DeBERTa-v3's options
        return t.DebertaV2Config(
            **deberta,
            type_vocab_size=0,
            position_buckets=16,
            max_relative_positions=64,
            pos_att_type=["p2c", "c2p"],
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
            layer_norm_eps=1e-7,
        )
    if name == "deberta-v2-unshared":
        return t.DebertaV2Config(
            **deberta,
            type_vocab_size=2,
            max_relative_positions=24,
            pos_att_type="c2p|p2c",
            share_att_key=False,
            position_biased_input=True,
            embedding_size=16,
            layer_norm_eps=1e-7,
        )
    raise ValueError(f"no test checkpoint for {name!r}; known: {FAMILY_NAMES}")


def _prenorm_config(name: str, common: dict):
    """EuroBERT's, mmBERT's and ModernBERT's test configs."""
    import transformers as t

    # The pre-norm families (EuroBERT, ModernBERT, mmBERT) at transformers' 0.02 init (before
    # the 0.1 perturbation): at 0.2 their unnormalised residual stream grows layer by layer
    # and the bf16 comparison measured that growth (EuroBERT's hidden state: 0.038 at 0.2).
    if name == "eurobert":  # grouped-query attention: 2 key/value heads for 4 query heads
        return t.EuroBertConfig(
            **{**common, "initializer_range": 0.02},
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            max_position_embeddings=256,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
            bos_token_id=2,
            eos_token_id=3,
            mask_token_id=4,
        )
    if name == "mmbert":
        return t.ModernBertConfig(
            **{**common, "initializer_range": 0.02},
            hidden_size=HIDDEN,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=40,
            max_position_embeddings=512,
            local_attention=8,
            bos_token_id=2,
            cls_token_id=2,
            eos_token_id=1,
            sep_token_id=1,
        )
    if name == "modernbert":
        return t.ModernBertConfig(
            **{**common, "initializer_range": 0.02},
            hidden_size=HIDDEN,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=256,
            global_attn_every_n_layers=2,
            local_attention=16,
            global_rope_theta=1000.0,
            local_rope_theta=100.0,
            classifier_pooling="mean",
            bos_token_id=2,
            cls_token_id=2,
            eos_token_id=3,
            sep_token_id=3,
        )
    raise ValueError(name)


def _decoder_config(name: str, common: dict):
    """Qwen3's, Qwen2's and Llama's test configs."""
    import transformers as t

    # The decoders: grouped-query attention (2 key/value heads for 4 query heads). Qwen3 with
    # heads wider than hidden / heads (16, as Qwen3's 128 are) and tied embeddings; Qwen2 with
    # its q/k/v biases; Llama with Llama 3.1's rotary scaling, its original context (64) short
    # enough that two of its frequencies are blended and one divided by the factor.
    decoder = dict(
        **{**common, "initializer_range": 0.02},
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=256,
    )
    if name == "qwen3":
        return t.Qwen3Config(
            **decoder,
            head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
            tie_word_embeddings=True,
            eos_token_id=2,
        )
    if name == "qwen2":
        return t.Qwen2Config(
            **decoder, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
    if name == "llama":
        return t.LlamaConfig(
            **decoder,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 100.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            bos_token_id=1,
            eos_token_id=2,
        )
    raise ValueError(name)


def tokenizer_kind(name: str) -> tuple[str, list[str], tuple[str, str]]:
    """(kind, special tokens in id order, (first, last)) of `name`'s test tokenizer."""
    return VARIANT_TOKENIZERS.get(name) or TOKENIZERS[VARIANTS.get(name, name)]


@functools.cache
def _trained(kind: str, specials: tuple[str, ...], texts: tuple[str, ...]) -> str:
    """A `tokenizers` tokenizer of `kind` trained on `texts`, as JSON (each caller makes its own
    from it). Kept per process: a session's tests build the same checkpoints several times, and
    training is most of a build."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = list(specials)
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind == "spm-bpe":  # SentencePiece-style BPE (Gemma's): metaspace, byte fallback
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials)
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence(
            [normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
        )
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        unk = "<unk>" if "<unk>" in specials else "[UNK]"
        # Halving the seed vocabulary each round with one EM pass, pieces of 8 characters at
        # most: the 600 pieces come several times sooner than with the defaults
        trainer = trainers.UnigramTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            unk_token=unk,
            shrinking_factor=0.5,
            n_sub_iterations=1,
            max_piece_length=8,
        )
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def _tokenizer(name: str, texts: list[str]):
    """A fast tokenizer of the kind of `name`'s checkpoints (a family's, or a variant's own)
    trained on `texts`."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    kind, specials, (first, last) = tokenizer_kind(name)
    tok = Tokenizer.from_str(_trained(kind, tuple(specials), tuple(texts)))
    ids = {s: tok.token_to_id(s) for s in specials}
    assert [ids[s] for s in specials] == list(range(len(specials))), ids
    if kind == "bpe" and first == "<s>":
        tok.post_processor = processors.RobertaProcessing((last, ids[last]), (first, ids[first]))
    elif name in DECODER_TOKENIZERS:  # Qwen's add nothing; Llama 3's a BOS before each text
        single, pair = ("$A", "$A $B:1") if not first else (f"{first} $A", f"{first} $A $B:1")
        added = [(first, ids[first])] if first else []
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=added
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{first} $A {last}",
            pair=f"{first} $A {last} $B:1 {last}:1",
            special_tokens=[(first, ids[first]), (last, ids[last])],
        )
    pad = next((s for s in specials if "pad" in s.lower()), last)
    unk = next(s for s in specials if "unk" in s.lower())
    mask = next(s for s in specials if "mask" in s.lower())
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad,
        unk_token=unk,
        mask_token=mask,
        cls_token=first or None,
        sep_token=last,
        bos_token=first or None,
        eos_token=last,
        model_max_length=512,
        chat_template=CHAT_TEMPLATES.get(name),
    )


def sentencepiece_dir(out: str | Path) -> Path:
    """A tokenizer directory as DeBERTa-v3 checkpoints ship it: only a SentencePiece Unigram
    model (`spm.model`, trained on the real comments with the `sentencepiece` library) and a
    `tokenizer_config.json` naming `DebertaV2Tokenizer`; no `tokenizer.json`."""
    import json

    import sentencepiece as spm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(read_comments(SAMPLE_CSV).texts),
        model_prefix=str(out / "spm"),
        vocab_size=VOCAB,
        model_type="unigram",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        user_defined_symbols=["[MASK]"],
        minloglevel=2,
    )
    (out / "spm.vocab").unlink()
    config = {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def build(name: str, out: str | Path, seed: int = 0) -> Path:
    """Writes the test checkpoint of `name` (a family, or a key of `VARIANTS`) to `out`."""
    import torch
    from transformers import AutoModel

    out = Path(out)
    texts = read_comments(SAMPLE_CSV).texts
    tokenizer = _tokenizer(name, texts)
    torch.manual_seed(seed)
    model = AutoModel.from_config(_config(name, tokenizer.pad_token_id))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.families", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory; one subdirectory per family")
    parser.add_argument(
        "--family",
        action="append",
        choices=FAMILY_NAMES + tuple(VARIANTS),
        help="build only this family (repeatable) [default: every family]",
    )
    parser.add_argument("--seed", type=int, default=0, help="init seed [default: 0]")
    args = parser.parse_args(argv)
    for name in args.family or FAMILY_NAMES:
        print(build(name, Path(args.out) / name, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
