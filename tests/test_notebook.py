"""The example notebook (`docs/examples/jigsaw-multilingual-v5e.ipynb`) run as a Kaggle or
Colab user runs it: through a real Jupyter kernel (nbclient), on the CPU, with tiny settings
put in after its settings cell (as papermill puts parameters) and one device, as on Colab's
TPU v5e-1."""

from __future__ import annotations

import csv
import time

import pytest

from parity_tests.harness import ROOT

NOTEBOOK = ROOT / "docs" / "examples" / "jigsaw-multilingual-v5e.ipynb"


@pytest.mark.e2e
@pytest.mark.model
def test_the_example_notebook_trains_evaluates_and_writes_a_submission(real_csv, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from parity_tests.competitions import write_language_file

    valid = write_language_file(real_csv, tmp_path / "validation.csv", 60, 2000, 1)
    test = write_language_file(real_csv, tmp_path / "test.csv", 40, 3000, 2, labelled=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    settings = f"""
NUM_DEVICES = 1
TRAIN_CSV, VALID_CSV, TEST_CSV = "sample", {str(valid)!r}, {str(test)!r}
WORKDIR = {str(tmp_path / "run")!r}
PRESET = "tiny"
MORE_FLAGS = ["--max-steps", "6", "--max-len", "32"]
INSTALL = False
"""
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(settings))
    t0 = time.perf_counter()
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    print(f"notebook executed in {time.perf_counter() - t0:.1f} s")
    evaluation = "".join(o.get("text", "") for o in nb.cells[-3].outputs)
    assert "'auc'" in evaluation and "'auc_lang_es'" in evaluation, evaluation
    with open(tmp_path / "submission.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "toxic"] and [r[0] for r in rows[1:]] == [str(i) for i in range(40)]
    assert all(0 < float(r[1]) < 1 for r in rows[1:])
