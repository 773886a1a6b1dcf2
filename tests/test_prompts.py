"""`--prompt-template` (issue 56, item 4): each row as one prompt for a decoder classifier,
rendered through the tokenizer's chat template token for token as transformers'
`apply_chat_template` gives it, the comment cut at --max-len and never the instructions; the
template's refusals, and the rows of every reader as prompts (a rules file's columns, a
comments file's comment alone)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from jaxtpu.core.data import prompts, readers, taskdata, templates
from jaxtpu.core.data.demo import SAMPLE_CSV
from jaxtpu.core.data.tokens import encode_texts, tokenizer_fingerprint
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags.schema import Config, validate
from jaxtpu.core.tasks import get_task
from jaxtpu.core.textformat import PROMPT as PROMPT_FORM
from jaxtpu.core.textformat import TextFormat
from parity_tests.families import _tokenizer as family_tokenizer

PROMPT = "Rule: {rule}\\nComment: {comment}\\nDoes the comment break the rule?"
RULES = ({"rule": "No spam."}, {"rule": "  No insults\n or  attacks. "})
ASKED = "Does the comment break the rule?"


@pytest.fixture(scope="module")
def comments() -> list[str]:
    return readers.read_comments(SAMPLE_CSV).texts[:60]


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "llama"])
def decoder(request, comments):
    """The decoder test tokenizers, each with its kind's chat template (Qwen2.5's adds a
    system message; Llama 3's a BOS and the message trimmed)."""
    return family_tokenizer(request.param, comments)


def items_of(comments: list[str], template: str = PROMPT) -> list[tuple[prompts.Message, str]]:
    t = templates.PromptTemplate(template)
    return [(t.render(RULES[k % 2]), c) for k, c in enumerate(comments)]


def chat_ids(tok, message: str) -> list[int]:
    out = tok.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_a_prompt_is_the_chat_templates_tokens_with_either_padding(decoder, comments):
    items = items_of(comments)
    for side in ("right", "left"):
        decoder.padding_side = side
        ids, mask = encode_texts(items, decoder, 4096, PROMPT_FORM)  # every prompt whole
        for (message, comment), row, m in zip(items, ids, mask, strict=True):
            want = chat_ids(decoder, message.before + comment + message.after)
            assert row[m == 1].tolist() == want
            real = np.flatnonzero(m)
            assert real.size == len(want) and np.ptp(real) == real.size - 1  # one run
            assert (real[0] == 0) == (side == "right")
    decoder.padding_side = "right"
    # the template's text as written, the rule's value whitespace-normalised
    assert "Rule: No insults or attacks.\nComment: " in decoder.decode(ids[1][mask[1] == 1])


def test_at_max_len_the_comment_is_cut_never_the_instructions(decoder, comments):
    items = items_of(comments)
    cut_ids, cut_mask = encode_texts(items, decoder, 128, PROMPT_FORM)
    cut = 0
    for side in ("right", "left"):
        decoder.truncation_side = side
        ids, mask = encode_texts(items, decoder, 128, PROMPT_FORM)
        for (message, comment), row, m in zip(items, ids, mask, strict=True):
            full = chat_ids(decoder, message.before + comment + message.after)
            got = row[m == 1].tolist()
            assert len(got) == min(len(full), 128)
            if len(full) <= 128:
                assert got == full
                continue
            cut += side == "right"
            # one contiguous run of `full` is gone, and it is the comment's
            j = next(k for k in range(len(got) + 1) if k == len(got) or got[k] != full[k])
            assert got[j:] == full[len(full) - (len(got) - j) :]
            before = message.before
            text = decoder.decode(got)
            said = before.strip().split("\n")[-1]  # "Comment:", the instructions' last line
            assert said in text and text.rstrip().endswith(decoder.decode(full[-6:]).rstrip())
            assert ASKED in text
            # right: the comment's first word stays; left: its last
            word = comment.split()[0] if side == "right" else comment.split()[-1]
            assert word in text.split("Comment:", 1)[1]
    decoder.truncation_side = "right"
    assert cut > 10  # most real comments are longer than 128 tokens with a prompt
    assert cut_ids.shape == (len(items), 128)


def test_instructions_that_leave_no_room_are_refused_before_any_token(decoder, comments):
    long_rule = {"rule": "Be civil. " * 40}
    t = templates.PromptTemplate(PROMPT)
    with pytest.raises(DataError, match="the prompt without its comment takes .* raise --max-len"):
        encode_texts([(t.render(long_rule), comments[0])], decoder, 128, PROMPT_FORM)


def test_the_chat_template_is_part_of_the_token_cache_key(comments):
    tok = family_tokenizer("qwen3", comments)
    before = tokenizer_fingerprint(tok)
    tok.chat_template = tok.chat_template.replace("assistant", "model")
    assert tokenizer_fingerprint(tok) != before


def test_without_a_chat_template_the_prompt_is_one_text_with_the_tokenizers_specials(
    tokenizer, comments
):
    items = items_of(comments[:5])
    ids, mask = encode_texts(items, tokenizer, 256, PROMPT_FORM)
    for (message, comment), row, m in zip(items, ids, mask, strict=True):
        want = tokenizer(message.before + comment + message.after)["input_ids"][:256]
        if len(want) <= 256:
            assert row[m == 1].tolist() == want  # [CLS] ... [SEP], one segment


@pytest.mark.parametrize(
    "template, rules, message",
    [
        ("Rule: {rule}", True, "names {comment} 0 times"),
        ("{comment} {rule} {comment}", True, "names {comment} 2 times"),
        ("Comment: {comment}", True, r"has no \{rule\}"),
        ("{subreddit}: {comment}", False, "names subreddit: a prompt of comments alone"),
        ("{rule} {comment", True, "--prompt-template"),
        ("{rule} {0} {comment}", True, "names one column"),
    ],
)
def test_a_bad_template_is_one_line(template, rules, message):
    with pytest.raises(DataError, match=message):
        templates.PromptTemplate(template, rules)


def test_the_flags_go_with_a_task_of_one_comment_and_not_with_a_rule_template():
    with pytest.raises(ConfigError, match="has no {comment}"):
        validate(Config().replace(prompt_template="Rule: {rule}", task="rules"))
    with pytest.raises(ConfigError, match="give one"):
        validate(Config().replace(prompt_template=PROMPT, rule_template="{rule} x", task="rules"))
    with pytest.raises(ConfigError, match="compares two comments"):
        validate(Config().replace(prompt_template="{comment}", task="ranking"))
    validate(Config().replace(prompt_template=PROMPT, task="rules"))
    fmt = Config().replace(prompt_template=PROMPT, task="rules").text_format
    assert fmt == TextFormat(PROMPT_FORM, PROMPT, rules=True) and not fmt.collapses_whitespace
    assert Config().replace(task="rules").text_format == TextFormat("pair", "{rule}", True)
    assert Config().text_format == TextFormat() and TextFormat.from_dict(fmt.to_dict()) == fmt


def test_every_reader_gives_prompts_a_rules_files_columns_and_comments_alone(tmp_path):
    rules_csv = tmp_path / "rules.csv"
    with open(rules_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row_id", "body", "rule", "subreddit", "rule_violation"])
        w.writerow([1, "buy  now", "No ads.", "r/x", 1])
        w.writerow([2, "hello", "No ads.", "r/y", 0])
    template = "r/{subreddit} asks: {rule}\\n{comment}\\nBroken?"
    fmt = TextFormat(PROMPT_FORM, template, rules=True)
    data = taskdata.read_task_file(rules_csv, get_task("rules"), fmt=fmt)
    assert data.first[0] == ("r/r/x asks: No ads.\n", "\nBroken?") and data.form == PROMPT_FORM
    assert data.texts == ["buy now", "hello"]
    scored = next(readers.comments_to_score(rules_csv, 10, fmt))
    assert scored.first == data.first and scored.form == PROMPT_FORM
    # a rule holding any character is the rule's text; the format, not the text, says pair
    pairs = taskdata.read_task_file(rules_csv, get_task("rules"), fmt=TextFormat("pair", "{rule}"))
    assert pairs.first[0] == "No ads." and pairs.form == "pair"
    assert templates.RuleTemplate().render({"rule": "No\x00 ads."}) == "No\x00 ads."
    comments = TextFormat(PROMPT_FORM, "Is it toxic? {comment}")
    # a comments file: the same prompt before every comment, through the file cache too
    for cache in (None, tmp_path / "cache"):
        toxic = taskdata.read_task_file(
            SAMPLE_CSV, get_task("toxicity"), cache_dir=cache, fmt=comments
        )
        assert set(toxic.first) == {("Is it toxic? ", "")} and toxic.form == PROMPT_FORM
        plain = taskdata.read_task_file(SAMPLE_CSV, get_task("toxicity"), cache_dir=cache)
        assert plain.first is None
        assert not (toxic.text_digests() == plain.text_digests()).all(1).any()
    chunk = next(readers.comments_to_score(SAMPLE_CSV, 5, comments))
    assert len(chunk.first) == 5 and chunk.encoded()[0][1] == chunk.texts[0]
    demo, _ = taskdata._training_rows(
        Config().replace(prompt_template="Is it toxic? {comment}", train_csv=""), tmp_path
    )
    assert demo.first == [("Is it toxic? ", "")] * len(demo)  # the demo rows too


@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.torch  # transformers' classifier of the export imports torch_xla through accelerate
def test_a_decoder_rules_run_trains_predicts_and_exports_on_its_prompts(real_csv, tmp_path):
    """A Qwen3 rules run with a prompt (2 fp32 steps): `jaxtpu predict` and the Python API
    score the prompts it trained on, as transformers' own classifier of its export scores
    `apply_chat_template`'s tokens of each prompt; `jaxtpu evaluate` reads them too."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    import jaxtpu
    from jaxtpu import evaluate, export, predict
    from parity_tests.competitions import write_rules_files
    from parity_tests.families import build
    from tests.helpers import cli

    train, test, labelled = write_rules_files(real_csv, tmp_path / "data")
    base = build("qwen3", tmp_path / "base")
    wd = tmp_path / "run"
    flags = ["--model-dir", base, "--head", "hf", "--task", "rules", "--precision", "fp32"]
    flags += ["--prompt-template", PROMPT, "--max-len", "128", "--max-rows", "64"]
    proc = cli("jaxtpu.train", *flags, "--train-csv", train, "--max-steps", "2", "--workdir", wd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr  # the run shows the first prompt as the model reads it
    assert (
        "laid out by the tokenizer's chat template); the first: '<|im_start|>user\\nRule: " in said
    )
    out = tmp_path / "submission.csv"
    assert predict.main(["--workdir", str(wd), "--input", str(test), "--output", str(out)]) == 0
    written = {r["row_id"]: float(r["rule_violation"]) for r in csv.DictReader(open(out))}
    assert evaluate.main(["--workdir", str(wd), "--input", str(labelled)]) == 0

    assert export.main(["--workdir", str(wd), "--out", str(tmp_path / "hf")]) == 0
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    rows = readers.read_rules(test, False, template=templates.PromptTemplate(PROMPT))

    def whole(k: int) -> str:
        return rows.first[k].before + rows.texts[k] + rows.first[k].after

    chosen = [k for k in range(40) if len(chat_ids(tok, whole(k))) <= 128]
    assert len(chosen) >= 5
    with torch.no_grad():
        theirs = np.array([
            clf(torch.tensor([chat_ids(tok, whole(k))]))
            .logits[0, 0].item()
            for k in chosen
        ])  # fmt: skip
    probs = 1 / (1 + np.exp(-theirs))
    assert np.abs(probs - [written[rows.ids[k]] for k in chosen]).max() < 1e-4
    # the API takes (rule, comment) pairs and puts them in the run's prompt
    model = jaxtpu.load(wd, num_devices=1)
    rule_of = [str(rows.groups.rule[k]) for k in chosen]
    ours = model.logits([(r, rows.texts[k]) for r, k in zip(rule_of, chosen, strict=True)])
    assert np.abs(ours - theirs).max() < 1e-4 * max(1.0, np.abs(theirs).max())


@pytest.mark.parametrize(
    "template", ["Rule: {rule}\nComment: {comment}\nAnswer {", "Rule: {rule} } {comment}"]
)
def test_unbalanced_braces_in_a_prompt_template_name_the_prompt_flag(template):
    # the run's template is the prompt whenever one is given (`Config.text_format`)
    prompt = Config().replace(prompt_template=template, task="rules").text_format
    with pytest.raises(DataError, match="^--prompt-template"):
        templates.template_of(prompt)
    with pytest.raises(DataError, match="^--rule-template"):
        templates.template_of(Config().replace(rule_template="{rule} {", task="rules").text_format)


def test_the_text_format_is_the_recorded_one_and_a_decoder_is_refused_text_pairs():
    """`RunSpec`'s text format resolver: a finished run's recorded format wins over the
    flags; a decoder reads a rules row as one prompt, never as a text pair."""
    from jaxtpu.core.flags.runspec import _text_format
    from jaxtpu.core.hf.encoder import EncoderConfig

    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    qwen3 = EncoderConfig(model_type="qwen3", intermediate_size=48, vocab_size=100, **shape)
    rules = Config().replace(task="rules")
    with pytest.raises(ConfigError, match="--task rules on qwen3: a decoder reads the rule"):
        _text_format(rules, {}, qwen3)
    asked = rules.replace(prompt_template=PROMPT)
    assert _text_format(asked, {}, qwen3) == TextFormat(PROMPT_FORM, PROMPT, rules=True)
    recorded = {"text_format": TextFormat(PROMPT_FORM, "{rule}: {comment}", True).to_dict()}
    assert _text_format(asked, recorded, qwen3).template == "{rule}: {comment}"
