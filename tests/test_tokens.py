"""The tokenizer and the token cache (`jaxtpu.core.data.tokens`): a run's own tokenizer,
damaged or stale cache entries, and a full disk while saving."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    one_line_exit_2,
)

from jaxtpu import train
from jaxtpu.core import files
from jaxtpu.core.data import tokens
from jaxtpu.core.errors import DataError


@pytest.mark.model
def test_a_refused_run_leaves_no_tokenizer_and_a_run_writes_its_own(tmp_path, capsys, minilm_dir):
    wd = tmp_path / "run"
    wd.mkdir()  # made by the user: kept, but emptied of what the refused run added
    one_line_exit_2(
        capsys,
        lambda: train.main(["--preset", "tiny", "--vocab-size", "1000", "--workdir", str(wd)]),
    )
    assert sorted(p.name for p in wd.iterdir()) == []
    stale = wd / "tokenizer"
    stale.mkdir()
    (stale / "tokenizer.json").write_text("{}")  # an earlier run's, not this one's
    assert train.main(["--preset", "tiny", "--max-steps", "2", "--workdir", str(wd)]) == 0
    written = json.loads((stale / "tokenizer.json").read_text())
    source = json.loads((Path(minilm_dir) / "tokenizer.json").read_text())
    assert written["model"]["vocab"] == source["model"]["vocab"]


def test_a_damaged_token_cache_entry_is_dropped_and_rebuilt(tmp_path, tokenizer, caplog):
    texts = ["a comment", "another comment"]
    ids = np.array(tokens.tokenize(texts, tokenizer, 16, tmp_path)[0])  # a copy: it is mapped
    (entry,) = tmp_path.glob("*.npy")
    entry.write_bytes(entry.read_bytes()[:40])  # truncated, as a full disk or a crash leaves it
    with caplog.at_level(logging.WARNING):
        again, _, hit = tokens.tokenize(texts, tokenizer, 16, tmp_path)
    assert not hit and np.array_equal(ids, again)
    assert "is damaged (ValueError); dropped, tokenizing again" in caplog.text
    assert tokens.tokenize(texts, tokenizer, 16, tmp_path)[2]  # rebuilt: a hit now


def test_a_stale_temporary_of_a_killed_writer_is_removed(tmp_path, tokenizer):
    dead = 2**22 + 12345  # beyond pid_max's default: no such process
    stale = tmp_path / f".abc.npy.{dead}.0123abcd.tmp"
    stale.write_bytes(b"half")
    live = tmp_path / f".abc.npy.{os.getpid()}.0123abcd.tmp"  # a writer still at work
    live.write_bytes(b"half")
    tokens.tokenize(["a comment"], tokenizer, 16, tmp_path)
    assert not stale.exists() and live.exists()
    assert files.remove_stale_temporaries(tmp_path) == 0


def test_a_full_disk_while_saving_the_tokenizer_is_one_line_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch
):
    import errno

    def full(path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{")  # half written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tokenizer, "save_pretrained", full)
    with pytest.raises(DataError, match="no space left on device writing the tokenizer"):
        tokens.save_tokenizer(tokenizer, tmp_path / "tokenizer")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_in_the_fast_tokenizers_own_writer_is_one_line_and_leaves_nothing(
    tmp_path, tokenizer, monkeypatch
):
    """The Rust writer of tokenizer.json reports a full disk as a plain Exception (not an
    OSError): the same one line, nothing left behind (a DataError, so a run cleans its new
    directory and lock too)."""

    def full(path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer_config.json").write_text("{}")
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(tokenizer, "save_pretrained", full)
    with pytest.raises(DataError, match="no space left on device writing the tokenizer"):
        tokens.save_tokenizer(tokenizer, tmp_path / "tokenizer")
    assert list(tmp_path.iterdir()) == []


def _asked_auto(monkeypatch) -> list[str]:
    """The directories AutoTokenizer is asked for from now on (it still answers)."""
    import transformers

    asked, auto = [], transformers.AutoTokenizer.from_pretrained

    def counted(path, *args, **kwargs):
        asked.append(str(path))
        return auto(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    return asked


def test_a_tokenizer_directory_loaded_again_gets_autotokenizers_class_without_asking_it(
    tmp_path, minilm_dir, monkeypatch
):
    import shutil

    import transformers

    from jaxtpu.core.hf import tokenizer_class

    d = tmp_path / "tok"
    shutil.copytree(minilm_dir, d, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    (d / f"{tmp_path.name}.txt").write_text("")  # a key no other test's directory has
    asked = _asked_auto(monkeypatch)
    first = tokens.load_tokenizer(d)
    again = tokens.load_tokenizer(d)
    assert asked == [str(d)]  # the second load read the remembered class
    assert type(again) is type(first)
    texts = ["A comment, with  Ünïcode and [SEP] marks.", "short"]
    assert again(texts, padding=True)["input_ids"] == first(texts, padding=True)["input_ids"]
    assert tokens.tokenizer_fingerprint(again) == tokens.tokenizer_fingerprint(first)

    # what the class choice reads changed: AutoTokenizer is asked again
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    tokens.load_tokenizer(d)
    assert asked == [str(d)] * 2
    # a remembered class that no longer imports is a miss, never an error
    key = tokenizer_class.choice_key(d, transformers.__version__)
    tokenizer_class.memo_path(key).write_text("transformers.nowhere:Gone\n")
    assert type(tokens.load_tokenizer(d)) is type(first)
    assert asked == [str(d)] * 3
