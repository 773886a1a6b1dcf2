"""The data pipeline: CSV validation messages, pairs, splits, batches, tokenization cache."""

from __future__ import annotations

import numpy as np
import pytest

from jaxtpu.core.data import buckets, demo, pairing, readers, records, taskdata, tokens
from jaxtpu.core.data.splits import split
from jaxtpu.core.errors import DataError
from jaxtpu.core.flags import presets
from jaxtpu.core.tasks import SEVERITY_WEIGHTS, get_task

HEADER = "id,comment_text,toxic,severe_toxic,obscene,threat,insult,identity_hate\n"


def write(tmp_path, text: str | bytes, name: str = "f.csv"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


BAD_CLASSIFICATION = [
    ("missing column", "id,comment_text\n1,hello\n", r"missing columns; found: id, comment_text"),
    ("empty file", "", r"file is empty"),
    ("header only", HEADER, r"has a header \(id, comment_text.*\) but no data rows"),
    ("label 2", HEADER + "1,hi,2,0,0,0,0,0\n", r"line 2: toxic=2 is outside \[0, 1\]"),
    ("label -1", HEADER + "1,hi,0,0,0,0,0,0\n2,yo,-1,0,0,0,0,0\n", r"line 3: toxic=-1 is outside"),
    ("label yes", HEADER + "1,hi,yes,0,0,0,0,0\n", r"line 2: toxic='yes' is not a number"),
    ("label nan", HEADER + "1,hi,nan,0,0,0,0,0\n", r"line 2: toxic=nan is outside"),
    ("blank label", HEADER + "1,hi,,0,0,0,0,0\n", r"line 2: toxic is blank"),
    ("sub-label bad", HEADER + "1,hi,1,0,x,0,0,0\n", r"line 2: obscene='x' is not a number"),
    ("all empty comments", HEADER + '1,"  ",1,0,0,0,0,0\n2,,0,,,,,\n', r"all 2 rows dropped"),
]


@pytest.mark.parametrize(
    "name,text,message", BAD_CLASSIFICATION, ids=[b[0] for b in BAD_CLASSIFICATION]
)
def test_bad_classification_csv_names_the_problem(tmp_path, name, text, message):
    p = write(tmp_path, text)
    with pytest.raises(DataError, match=message) as e:
        readers.read_comments(p)
    assert str(p) in str(e.value)


def test_not_utf8_names_byte_and_line(tmp_path):
    p = write(tmp_path, HEADER.encode() + b"1,caf\xe9,0,0,0,0,0,0\n")
    with pytest.raises(DataError, match=r"not UTF-8 text \(byte 0xe9 at line 2\)"):
        readers.read_comments(p)


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        readers.read_comments(tmp_path)
    with pytest.raises(DataError, match="no such file"):
        readers.read_comments(tmp_path / "nope.csv")


def test_pairs_file_rules(tmp_path):
    p = write(tmp_path, "worker,less_toxic,more_toxic\n1,nice,you idiot\n2,,x\n")
    pairs = readers.read_pairs(p)
    assert (pairs.less, pairs.more, pairs.dropped) == (["nice"], ["you idiot"], 1)
    with pytest.raises(DataError, match="expected: less_toxic, more_toxic"):
        readers.read_pairs(write(tmp_path, "a,b\n1,2\n", "g.csv"))
    with pytest.raises(DataError, match=r"expected: less_toxic, more_toxic \(pairs\) or"):
        taskdata.read_task_file(write(tmp_path, "a,b\n1,2\n", "g.csv"), get_task("ranking"))


def test_score_file_and_unlabelled(tmp_path):
    s = readers.read_comments(write(tmp_path, "comment_id,text\n7, a  b\n"), labelled=False)
    assert s.texts == ["a b"] and s.ids == ["7"] and s.labels is None
    u = readers.read_comments(
        write(tmp_path, "id,comment_text\nx,hello\n", "u.csv"), labelled=False
    )
    assert u.texts == ["hello"] and u.ids == ["x"]


def test_whitespace_normalised_dropped_counted_float_labels(tmp_path):
    text = HEADER + '1,"a\n\t b  ",0.25,,,,,\n2,"  ",1,0,0,0,0,0\n3,c,1,1,0,0,0,0\n'
    c = readers.read_comments(write(tmp_path, text))
    assert c.texts == ["a b", "c"]
    assert c.dropped == 1
    np.testing.assert_array_equal(c.labels, np.array([0.25, 1.0], np.float32))
    assert np.isnan(c.sublabels[0]).all() and c.sublabels[1, 0] == 1.0


def test_severity_uses_toxic_alone_when_sublabels_blank():
    nan = np.nan
    c = records.Comments(
        "x",
        ["a", "b", "c"],
        np.array([1.0, 1.0, 0.0], np.float32),
        np.array([[nan] * 5, [1, 0, 0, 0, 0], [0] * 5], np.float32),
    )
    w = SEVERITY_WEIGHTS
    np.testing.assert_allclose(c.severity(), [w[0], w[0] + w[1], 0.0], rtol=1e-6)


def test_pairs_from_labels_are_ordered_and_seeded():
    c = demo.demo_comments(200, seed=3)
    sev = dict(zip(c.texts, c.severity(), strict=False))
    p1 = pairing.pairs_from_labels(c, 100, seed=1)
    p2 = pairing.pairs_from_labels(c, 100, seed=1)
    assert len(p1) == 100 and p1.less == p2.less and p1.more == p2.more
    assert all(sev[a] < sev[b] for a, b in zip(p1.less, p1.more, strict=True))
    same = records.Comments("s", ["a", "b"], np.ones(2, np.float32), np.zeros((2, 5), np.float32))
    with pytest.raises(DataError, match="same severity"):
        pairing.pairs_from_labels(same, 5, 0)


def test_split_is_stratified_disjoint_and_seeded():
    c = demo.demo_comments(500, seed=0)
    tr, va = split(c, 0.2, seed=4)
    tr2, va2 = split(c, 0.2, seed=4)
    np.testing.assert_array_equal(va, va2)
    assert set(tr).isdisjoint(va) and len(tr) + len(va) == 500
    assert abs(c.labels[va].mean() - c.labels.mean()) < 0.02
    folds = [split(c, 0.1, 0, n_folds=5, fold=k)[1] for k in range(5)]
    assert sorted(np.concatenate(folds).tolist()) == list(range(500))


def test_train_batches_same_seed_same_batches_and_resume_offset():
    a = list(buckets.shuffled_batches(100, 16, seed=1, epoch=0))
    b = list(buckets.shuffled_batches(100, 16, seed=1, epoch=0))
    c = list(buckets.shuffled_batches(100, 16, seed=1, epoch=1))
    assert len(a) == 6 and all(x.shape == (16,) for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    tail = list(buckets.shuffled_batches(100, 16, seed=1, epoch=0, start_step=4))
    assert all(np.array_equal(x, y) for x, y in zip(a[4:], tail, strict=True))


@pytest.mark.parametrize("devices", range(1, 9))
def test_eval_batches_score_each_example_once(devices):
    n, per_device = 37, 3
    gb = per_device * devices
    seen = []
    padded = buckets.Batcher(np.zeros(n, np.int64), gb, max_len=16)
    for b in padded.eval_batches(np.full(n, 16)):
        assert b.idx.shape == (gb,) and b.weight.shape == (gb,)
        seen.extend(b.idx[b.weight > 0].tolist())
    assert sorted(seen) == list(range(n))


def test_tokenize_pads_truncates_and_caches(tokenizer, tmp_path):
    texts = ["hello world", "a much longer comment " * 40]
    ids, mask, hit = tokens.tokenize(texts, tokenizer, 16, tmp_path)
    assert not hit and ids.shape == (2, 16) and ids.dtype == np.int32
    assert mask[0].sum() == 4 and mask[1].sum() == 16  # [CLS] hello world [SEP]; truncated
    ids2, mask2, hit2 = tokens.tokenize(texts, tokenizer, 16, tmp_path)
    assert hit2 and np.array_equal(ids, ids2) and np.array_equal(mask, mask2)
    _, _, hit3 = tokens.tokenize(texts, tokenizer, 32, tmp_path)  # other max_len: a new key
    assert not hit3


def test_load_task_data_ranking_from_labels_hits_cache_second_time(tokenizer, tmp_path):
    cfg = presets.tiny().replace(task="ranking", cache_dir=str(tmp_path))
    first = taskdata.load_task_data(cfg, tokenizer)
    second = taskdata.load_task_data(cfg, tokenizer)
    assert first.train.input_ids.shape[1:] == (2, cfg.data.max_len)
    assert not first.info["token_cache_hit"] and second.info["token_cache_hit"]
    assert np.array_equal(first.train.input_ids, second.train.input_ids)


def test_real_jigsaw_file_loads(real_csv):
    c = readers.read_comments(real_csv)
    assert len(c) > 9000 and 0.2 < c.labels.mean() < 0.3
    blank = np.isnan(c.sublabels).all(axis=1)
    assert 0.15 < blank.mean() < 0.35  # a quarter of rows label `toxic` only


def test_a_batch_is_made_to_the_tasks_batch_layout(tokenizer):
    """`Examples.take` builds its dict from `Task.batch_layout`: its keys, its dtypes, every
    key present; a layout key the examples cannot fill is named."""
    from jaxtpu.core.data.tokenized import Examples, encode
    from jaxtpu.core.tasks import get_task

    task = get_task("multilabel")
    examples = encode(demo.demo_comments(16, seed=1), tokenizer, 24, task=task)
    assert examples.layout == task.batch_layout(24)
    batch = examples.take(np.arange(4), length=16)
    assert list(batch) == list(task.batch_layout(24))
    for key, (shape, dtype) in task.batch_layout(24).items():
        assert batch[key].dtype == np.dtype(dtype), key
        tokens = key in ("input_ids", "attention_mask")  # cut to the batch's length
        assert batch[key].shape[1:] == ((16,) if tokens else shape), key
    wider = {**task.batch_layout(24), "sample_weight": ((), "float32")}
    odd = Examples(examples.input_ids, examples.attention_mask, examples.label, layout=wider)
    with pytest.raises(KeyError, match="sample_weight"):
        odd.take(np.arange(2))
