"""Input files as streams (`jaxtpu.core.data.tables`) and tokenization in chunks into a mapped
cache: Parquet and JSON Lines read as the same CSV, rows across chunk borders, the cache's reuse and
invalidation. Small inputs, no training."""

from __future__ import annotations

import copy
import csv
import fcntl
import json
import logging
import os
import shutil
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxtpu.core.data import buckets, readers, records, tables, taskdata, tokens
from jaxtpu.core.data.demo import demo_comments
from jaxtpu.core.errors import DataError
from parity_tests.families import _tokenizer as family_tokenizer

COLUMNS = ["id", "comment_text", "target", "male", "lang"]
ROWS = [
    ["a1", "first comment", 0.0, 0.5, "en"],
    ["a2", 'a comment over\nthree lines, "quoted",\nand a comma', 0.7, None, "es"],
    ["a3", "   ", 1.0, 0.0, "en"],  # empty after normalisation: dropped
    ["a4", "tabs\tand  spaces", 0.3, 1.0, "it"],
    ["a5", "ünïcödé ✓", 1.0, None, "tr"],
]


def write_all(tmp_path) -> dict[str, object]:
    """The same rows as CSV, Parquet and JSON Lines."""
    paths = {}
    paths["csv"] = tmp_path / "t.csv"
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows([["" if v is None else v for v in row] for row in ROWS])
    paths["parquet"] = tmp_path / "t.parquet"
    table = pa.table({c: [row[i] for row in ROWS] for i, c in enumerate(COLUMNS)})
    pq.write_table(table, paths["parquet"], row_group_size=2)  # rows across record batches
    paths["jsonl"] = tmp_path / "t.jsonl"
    with open(paths["jsonl"], "w", encoding="utf-8") as f:
        for row in ROWS:
            f.write(json.dumps(dict(zip(COLUMNS, row, strict=True))) + "\n")
    return paths


def test_parquet_and_json_lines_read_as_the_same_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BATCH", 2)
    got = {fmt: readers.read_comments(p) for fmt, p in write_all(tmp_path).items()}
    want = got.pop("csv")
    assert want.texts[1] == 'a comment over three lines, "quoted", and a comma'
    assert want.ids == ["a1", "a2", "a4", "a5"] and want.dropped == 1
    assert np.allclose(want.labels, [0.0, 0.7, 0.3, 1.0])
    assert np.isnan(want.groups.identities["male"][[1, 3]]).all()
    for fmt, c in got.items():
        assert (c.texts, c.ids, c.dropped) == (want.texts, want.ids, want.dropped), fmt
        assert np.array_equal(c.labels, want.labels), fmt
        assert np.array_equal(c.sublabels, want.sublabels, equal_nan=True), fmt
        assert np.array_equal(
            c.groups.identities["male"], want.groups.identities["male"], equal_nan=True
        ), fmt
        assert c.groups.lang.tolist() == want.groups.lang.tolist() == ["en", "es", "it", "tr"]


@pytest.mark.parametrize(
    "name, write, message",
    [
        (
            "bad json",
            lambda p: p.write_text('{"comment_text": "a", "toxic": 1}\n{"comm'),
            r"t.jsonl: line 2: not a JSON object",
        ),
        (
            "a list",
            lambda p: p.write_text('{"comment_text": "a", "toxic": 1}\n[1, 2]\n'),
            r"t.jsonl: line 2: not a JSON object, found list",
        ),
        (
            "label",
            lambda p: p.write_text(
                '{"comment_text": "a", "toxic": 1}\n{"comment_text": "b", "toxic": 3}\n'
            ),
            r"t.jsonl: line 2: toxic=3 is outside \[0, 1\]",
        ),
        (
            "an object for a comment",
            lambda p: p.write_text(
                '{"comment_text": "a", "toxic": 1}\n{"comment_text": {"body": "b"}, "toxic": 0}\n'
            ),
            r"t.jsonl: line 2: comment_text holds a JSON object, not text",
        ),
        (
            "a list for a comment",
            lambda p: p.write_text('{"comment_text": ["a", "b"], "toxic": 1}\n'),
            r"t.jsonl: line 1: comment_text holds a JSON list, not text",
        ),
        (
            "one json array",
            lambda p: p.write_text('[{"comment_text": "a", "toxic": 1}]\n'),
            r"t.jsonl: is one JSON array; jaxtpu reads JSON Lines \(one object per line",
        ),
        ("empty", lambda p: p.write_text("\n"), r"t.jsonl: file is empty"),
        ("columns", lambda p: p.write_text('{"text": "a"}\n'), r"t.jsonl: missing columns"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " not in v and "\\" not in v else "",
)
def test_json_lines_problems_are_one_line_with_the_line(tmp_path, name, write, message):
    path = tmp_path / "t.jsonl"
    write(path)
    with pytest.raises(DataError, match=message) as e:
        readers.read_comments(path)
    assert "\n" not in str(e.value)


def test_parquet_problems_name_the_row_or_the_file(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"comment_text": ["a", "b"], "toxic": [1.0, 2.0]}), path)
    with pytest.raises(DataError, match=r"t.parquet: row 2: toxic=2.0 is outside \[0, 1\]"):
        readers.read_comments(path)
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"t.parquet: not a readable Parquet file"):
        readers.read_comments(path)


def test_a_csv_is_read_as_a_stream(tmp_path):
    """Rows are produced while the file is read: the first row arrives before the reader has
    seen the (broken) last line."""
    path = tmp_path / "t.csv"
    path.write_bytes(b"comment_text,toxic\nfine,0\n" + b"more,1\n" * 3 + b"caf\xe9,1\n")
    rows = tables.open_table(path).rows()
    assert next(rows) == ("line 2", {"comment_text": "fine", "toxic": "0"})
    with pytest.raises(DataError, match=r"not UTF-8 text \(byte 0xe9 at line 6\)"):
        list(rows)


def cached(texts, tokenizer, max_len, cache):
    return tokens.cached_tokens(
        lambda: texts, tokens.digest_texts(texts), tokenizer, max_len, cache
    )


@pytest.mark.parametrize("kind", ["minilm", "roberta", "xlm-roberta", "left"])
def test_chunked_tokenizing_equals_one_call_and_is_mapped(kind, tmp_path, tokenizer, monkeypatch):
    """Chunks of the tokenizer's own encoder give what one call of the Hugging Face tokenizer
    gives (WordPiece, byte-level BPE, Unigram; padding and truncation on the left too)."""
    texts = [f"comment number {i} " + "word " * (i % 7) for i in range(11)]
    if kind in ("roberta", "xlm-roberta"):
        tokenizer = family_tokenizer(kind, texts * 3)
    elif kind == "left":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.padding_side = tokenizer.truncation_side = "left"
    one = tokenizer(texts, truncation=True, max_length=6, padding="max_length")
    monkeypatch.setattr(tokens, "CHUNK", 4)  # 11 texts: chunks of 4, 4 and a short 3
    ids, mask, hit = tokens.tokenize(texts, tokenizer, 6, tmp_path)
    assert not hit
    assert np.array_equal(ids, one["input_ids"]) and np.array_equal(mask, one["attention_mask"])
    again = cached(texts, tokenizer, 6, tmp_path)
    assert again.cache_hit and isinstance(again.ids.base, np.memmap)
    assert not again.ids.flags.writeable and np.array_equal(again.ids, ids)
    # The lengths the buckets need are kept beside the entry (rebuilt when their file is gone).
    assert np.array_equal(again.lengths, buckets.real_lengths(mask))
    (lengths,) = tmp_path.glob("*.lengths")
    lengths.unlink()
    assert (
        np.array_equal(cached(texts, tokenizer, 6, tmp_path).lengths, buckets.real_lengths(mask))
        and lengths.exists()
    )
    # Another length or other texts: another entry.
    assert not tokens.tokenize(texts, tokenizer, 7, tmp_path)[2]
    assert not tokens.tokenize(texts[:-1], tokenizer, 6, tmp_path)[2]
    assert len(list(tmp_path.glob("*.npy"))) == 3


def test_a_process_waits_for_the_entry_another_is_writing(tmp_path, tokenizer):
    """The processes of one host share an entry: while one holds its lock (writing it), another
    waits, then maps what the first wrote instead of tokenizing again."""
    texts = ["one comment", "and another"]
    tokens.tokenize(texts, tokenizer, 8, tmp_path / "a")
    (entry,) = (tmp_path / "a").glob("*.npy")
    shared = tmp_path / "b"
    shared.mkdir()
    fd = os.open(shared / f".{entry.stem}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "another process" is writing the entry
    got = {}
    waiter = threading.Thread(
        target=lambda: got.update(r=tokens.tokenize(texts, tokenizer, 8, shared))
    )
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive()  # blocked on the lock, not tokenizing
    shutil.copy(entry, shared / entry.name)  # the writer finishes ...
    os.close(fd)  # ... and lets go
    waiter.join(timeout=30)
    assert got["r"][2]  # a hit: it mapped the entry it waited for


def _demo_csv(path, n: int = 120):
    demo = demo_comments(n, seed=3)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", *records.SUBLABELS, "kfold"])
        for i, (t, y, sub) in enumerate(zip(demo.texts, demo.labels, demo.sublabels, strict=True)):
            w.writerow([f"c{i}", t, y, *sub, i % 3])
    return path


def test_a_second_run_reads_neither_the_file_nor_the_texts_until_they_change(
    tmp_path, tokenizer, monkeypatch
):
    """The file cache holds what the reader returns but the texts, keyed by the file's bytes;
    with the token entries keyed by the texts' digests, a second run needs no text at all. A
    changed file is read again; another --max-len reads the texts (not the rest) again."""
    from jaxtpu.core.flags import presets

    train = _demo_csv(tmp_path / "train.csv")
    cfg = presets.tiny().replace(
        train_csv=str(train), cache_dir=str(tmp_path / "cache"), fold_column="kfold", fold=1
    )
    first = taskdata.load_task_data(cfg, tokenizer)
    assert not first.info["token_cache_hit"] and list((tmp_path / "cache").glob("*.table.npz"))
    reads = []
    real = dict(readers.READERS)
    monkeypatch.setattr(
        readers,
        "READERS",
        {k: lambda *a, _r=r, **kw: reads.append(a[0]) or _r(*a, **kw) for k, r in real.items()},
    )
    second = taskdata.load_task_data(cfg, tokenizer)
    assert reads == [] and second.info["token_cache_hit"]
    for a, b in [(first.train, second.train), (first.valid, second.valid)]:
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.label, b.label)
        assert np.array_equal(a.real_lengths(), b.real_lengths())
    assert np.array_equal(first.valid_rows, second.valid_rows)
    # Another length: the texts are read again (once, for both splits), the same tokens result.
    longer = taskdata.load_task_data(cfg.replace(max_len=24), tokenizer)
    assert reads == [train] and not longer.info["token_cache_hit"]
    monkeypatch.setattr(readers, "READERS", real)
    fresh = taskdata.load_task_data(
        cfg.replace(max_len=24, cache_dir=str(tmp_path / "c2")), tokenizer
    )
    assert np.array_equal(longer.train.input_ids, fresh.train.input_ids)
    # A changed file is a new entry (the old one is not used).
    with open(train, "a", encoding="utf-8") as f:
        f.write("c999,a brand new comment,1,0,0,0,0,0,2\n")
    monkeypatch.setattr(
        readers,
        "READERS",
        {k: lambda *a, _r=r, **kw: reads.append(a[0]) or _r(*a, **kw) for k, r in real.items()},
    )
    changed = taskdata.load_task_data(cfg, tokenizer)
    assert reads == [train, train] and len(changed.train) + len(changed.valid) == 121


def test_a_damaged_file_cache_entry_is_read_again(tmp_path, caplog):
    from jaxtpu.core.tasks import get_task

    train = _demo_csv(tmp_path / "train.csv")
    task = get_task("toxicity")
    want = taskdata.read_task_file(train, task, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.table.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        got = taskdata.read_task_file(train, task, cache_dir=tmp_path)
    assert "is damaged" in caplog.text and list(got.texts) == want.texts
    assert np.array_equal(got.labels, want.labels)


def test_predicts_chunks_end_between_rows_never_inside_a_multi_line_comment(tmp_path):
    """`comments_to_score` cuts the stream into chunks of rows after the CSV reader has put
    each row together: a comment over three lines sits whole in the chunk where its row is,
    whatever the chunk size, and the chunks add up to the whole file."""
    path = write_all(tmp_path)["csv"]
    whole = readers.read_comments(path, labelled=False)
    for size in (1, 2, 3, 5, 100):
        chunks = list(readers.comments_to_score(path, size))
        assert [len(c) for c in chunks[:-1]] == [size] * (len(chunks) - 1)
        assert [t for c in chunks for t in c.texts] == whole.texts
        assert [i for c in chunks for i in c.ids] == whole.ids
        assert sum(c.dropped for c in chunks) == whole.dropped == 1
    assert whole.texts[1] == 'a comment over three lines, "quoted", and a comma'


def test_a_training_file_s_header_is_read_once(tmp_path, monkeypatch):
    """read_task_file opens the file and reads its header once; the reader (and, on a miss,
    the file cache) continues from that table instead of opening it again for its header."""
    from jaxtpu.core.tasks import get_task

    path = tmp_path / "train.csv"
    path.write_text("comment_text,toxic\nyou idiot,1\nthanks,0\nfine,0\n", encoding="utf-8")
    reads = []
    real = tables._HEADERS["csv"]
    monkeypatch.setitem(tables._HEADERS, "csv", lambda p: reads.append(p) or real(p))
    task = get_task("toxicity")
    assert len(taskdata.read_task_file(path, task)) == 3 and len(reads) == 1
    data = taskdata.read_task_file(path, task, cache_dir=tmp_path / "cache")  # a miss
    assert len(data) == 3 and len(reads) == 2


def test_a_json_lines_key_the_first_record_leaves_out_is_still_a_column(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = ['{"comment_text": "no id here", "toxic": 0}']
    lines += [
        f'{{"id": "c{i}", "comment_text": "comment {i}", "toxic": {i % 2}}}' for i in range(3)
    ]
    path.write_text("\n".join(lines) + "\n")
    assert tables.open_table(path).header == ["comment_text", "toxic", "id"]
    assert readers.read_comments(path).ids == ["", "c0", "c1", "c2"]
    (chunk,) = readers.comments_to_score(path, 10)
    assert chunk.ids == ["", "c0", "c1", "c2"]  # predict writes these, not row numbers


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "t.csv.gz",
            "gzip",
            r"t.csv.gz: is gzip-compressed; decompress it first \(gunzip t.csv.gz\)",
        ),
        ("t.csv.bz2", "bz2", r"t.csv.bz2: is bzip2-compressed; decompress it first \(bunzip2"),
        (
            "t.json",
            b'[{"comment_text": "a", "toxic": 1}]',
            r"t.json: is one JSON array; jaxtpu reads JSON Lines",
        ),
        (
            "t.json",
            b'{\n  "comment_text": "a"\n}\n',
            r"t.json: is a JSON document; jaxtpu reads JSON Lines",
        ),
        (
            "t.json",
            b'{"comment_text": "a", "toxic": 1}\n',
            r"t.json: looks like JSON Lines; name it .jsonl",
        ),
    ],
    ids=["gzip", "bzip2", "json array", "json document", "json lines named .json"],
)
def test_a_compressed_or_json_file_is_named_for_what_it_is(tmp_path, name, content, message):
    import bz2
    import gzip

    csv_text = b"id,comment_text,toxic\n1,hello,0\n2,you idiot,1\n"
    data = {"gzip": gzip.compress, "bz2": bz2.compress}.get(content, lambda _: content)(csv_text)
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=message) as e:
        readers.read_comments(path)
    assert "\n" not in str(e.value)


def test_a_csv_field_beyond_pythons_default_limit_is_read_and_one_past_ours_is_named(
    tmp_path, monkeypatch
):
    long = "word " * 40_000  # 200,000 characters: Python's csv stops at 131,072 by default
    path = tmp_path / "long.csv"
    path.write_text(f'comment_text,toxic\n"{long}",1\nshort,0\n')
    rows = [row for _, row in tables.open_table(path).rows()]
    assert [len(r["comment_text"]) for r in rows] == [len(long), 5]
    monkeypatch.setattr(tables, "MAX_FIELD_CHARS", 150_000)
    with pytest.raises(DataError, match="longer than 150,000 characters.*quote left open"):
        list(tables.open_table(path).rows())
