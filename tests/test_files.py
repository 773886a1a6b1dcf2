"""`jaxtpu.core.files.atomic_write`: the one writer of whole files (submissions, JSON records,
checkpoints, cache entries) leaves the old file or the new one, never a part, and no
temporary file behind."""

from __future__ import annotations

import pytest

from jaxtpu.core import files


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.json"
    files.write_text(path, "old")
    files.write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "out.csv"
    files.write_text(path, "id,toxic\n1,0.5\n")
    with pytest.raises(RuntimeError), files.atomic_write(path, newline="") as f:
        f.write("id,toxic\n1,")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "id,toxic\n1,0.5\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_the_new_file_has_the_usual_permissions(tmp_path):
    """Not the 0600 of a mkstemp file: a submission is readable as any file the user writes."""
    import os

    path = tmp_path / "scores.csv"
    files.write_text(path, "x")
    (tmp_path / "plain").write_text("x")
    assert os.stat(path).st_mode == os.stat(tmp_path / "plain").st_mode


def test_exported_weights_have_the_usual_permissions_not_safetensors_0600(tmp_path):
    """An export's weights are readable by whoever may read the rest of it (a server's
    account, a team directory): safetensors alone writes them 0600."""
    import os

    import numpy as np

    from jaxtpu.core.hf.directory import save_tensors

    path = save_tensors({"w": np.ones((2, 2), np.float32)}, tmp_path / "model.safetensors")
    (tmp_path / "plain").write_text("x")
    assert os.stat(path).st_mode == os.stat(tmp_path / "plain").st_mode
