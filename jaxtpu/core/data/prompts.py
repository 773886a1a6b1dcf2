"""Prompts: each comment inside instructions (`--prompt-template`), for the decoder
classifiers, tokenized as the model's chat template lays them out (framework-free).

A row's prompt travels as a pair (`Comments.first`, then the comment), its first a `Message`:
the template rendered over the row's columns, as the text before the comment and the text
after it (`templates.PromptTemplate`). The run's `TextFormat` says the items are prompts; no
item is looked at to find out. The tokenizer meets them here:

- The message is rendered through the tokenizer's chat template when it has one, as the one
  user message with the generation prompt after it, and tokenized without the tokenizer's own
  special tokens: token for token what `tokenizer.apply_chat_template([{"role": "user",
  "content": prompt}], add_generation_prompt=True)` gives. A tokenizer without a chat template
  tokenizes the prompt as any text (its special tokens added).
- At `--max-len`, the comment's last tokens are dropped (its first, for a tokenizer that
  truncates on the left), never the instructions: the whole prompt is tokenized once, with
  character offsets, and the tokens over the comment's characters are the ones cut. A prompt
  that fits is not cut at all, so it is the chat template's tokens exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from jaxtpu.core.errors import DataError

COMMENT = "comment"  # the template's name for the comment: `{comment}`
MIN_COMMENT_TOKENS = 8  # a prompt that leaves fewer for the comment is refused
# Where the comment goes while the chat template lays the message out, inside `chat_parts`
# alone: it is never in a text, an item or a file (the comment is placed by position).
_HOLE = "\x00"


class Message(NamedTuple):
    """A rendered prompt around its comment: the text before it and the text after it."""

    before: str
    after: str

    def shown(self) -> str:
        """The message as messages show it, `{comment}` in the comment's place."""
        return f"{self.before}{{comment}}{self.after}"


def chat_parts(tokenizer: Any, message: Message) -> tuple[str, str]:
    """(before, after): the text of the prompt around the comment, `message` laid out by the
    tokenizer's chat template when it has one."""
    if not getattr(tokenizer, "chat_template", None):
        return message.before, message.after
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": message.before + _HOLE + message.after}],
        tokenize=False,
        add_generation_prompt=True,
    )
    if text.count(_HOLE) != 1:
        raise DataError(
            "the tokenizer's chat template does not keep the message as it is given (the "
            "comment's place in it is lost); jaxtpu cannot truncate its comment alone"
        )
    before, after = text.split(_HOLE)
    return before, after


def prompt_text(tokenizer: Any, message: Message, comment: str) -> str:
    """The whole text of one prompt as the model reads it (before tokenizing)."""
    before, after = chat_parts(tokenizer, message)
    return before + comment + after


def _backend(tokenizer: Any) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise DataError(
            "--prompt-template needs a fast tokenizer (a tokenizer.json): the comment is found "
            "in the prompt by its tokens' character offsets"
        )
    backend.no_truncation()
    backend.no_padding()
    return backend


def _encode(tokenizer: Any, texts: list[str]) -> list[Any]:
    """The `tokenizers` encodings of whole prompts: special tokens added only when the
    tokenizer has no chat template (a chat template writes its own)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    return _backend(tokenizer).encode_batch(texts, add_special_tokens=not chat)


def check_prompts_fit(items: Sequence[tuple[Message, str]], tokenizer: Any, max_len: int) -> None:
    """Refuses prompts whose instructions (all but the comment) leave fewer than
    `MIN_COMMENT_TOKENS` of `max_len` for the comment: one line naming the longest."""
    messages = sorted({m for m, _ in items})
    parts = [chat_parts(tokenizer, m) for m in messages]
    lengths = [len(e.ids) for e in _encode(tokenizer, [a + b for a, b in parts])]
    worst = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[worst] + MIN_COMMENT_TOKENS > max_len:
        shown = messages[worst].shown()[:80]
        raise DataError(
            f"the prompt without its comment takes {lengths[worst]} tokens of --max-len "
            f"{max_len}, leaving under {MIN_COMMENT_TOKENS} for the comment, which is the one "
            f"truncated: raise --max-len or shorten --prompt-template (the longest: {shown!r})"
        )


def prompt_ids(
    items: Sequence[tuple[Message, str]], tokenizer: Any, max_len: int
) -> list[list[int]]:
    """The token ids of each (message, comment) prompt, at most `max_len` of them, unpadded:
    the chat template's tokens of the whole prompt, less the comment's last tokens when it is
    longer (`check_prompts_fit` has refused instructions that leave no room)."""
    parts = {m: chat_parts(tokenizer, m) for m in {m for m, _ in items}}
    texts, spans = [], []
    for message, comment in items:
        before, after = parts[message]
        texts.append(before + comment + after)
        spans.append((len(before), len(before) + len(comment)))
    left = getattr(tokenizer, "truncation_side", "right") == "left"
    out = []
    for enc, (a, b) in zip(_encode(tokenizer, texts), spans, strict=True):
        ids = enc.ids
        over = len(ids) - max_len
        if over > 0:
            # the tokens over the comment's characters (special tokens span no character)
            inside = [k for k, (s, e) in enumerate(enc.offsets) if s < e and s < b and e > a]
            if len(inside) <= over:
                raise DataError(
                    f"a prompt of {len(ids)} tokens has {len(inside)} in its comment: cutting "
                    f"it to --max-len {max_len} would cut the instructions; raise --max-len"
                )
            cut = set(inside[:over] if left else inside[len(inside) - over :])
            ids = [t for k, t in enumerate(ids) if k not in cut]
        out.append(ids)
    return out
