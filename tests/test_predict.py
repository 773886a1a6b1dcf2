"""Scoring a finished run (`jaxtpu.predict`, `jaxtpu.export`): output paths checked before
scoring, bad input refused with results kept, ensembles of unlike runs refused."""

from __future__ import annotations

import pytest
from helpers import cli, one_line, write

from jaxtpu.core.errors import UserError


@pytest.mark.e2e
def test_output_paths_are_checked_before_scoring(finished_run, tmp_path):
    to_score = tmp_path / "score.csv"
    to_score.write_text("comment_id,text\n1,hello\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    for output, message in [
        (a_file / "out.csv", "is not a directory"),
        (tmp_path, "is a directory"),
    ]:
        proc = cli(
            "jaxtpu.predict", "--workdir", finished_run, "--input", to_score, "--output", output
        )
        one_line(proc, f"--output {output}")
        assert message in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", finished_run, "--out", a_file / "model")
    one_line(proc, "is not a directory")
    proc = cli("jaxtpu.export", "--workdir", finished_run, "--out", a_file)
    one_line(proc, "is not an empty directory")
    assert a_file.read_text() == "keep"


@pytest.mark.e2e
def test_predict_and_export_refuse_bad_input_and_keep_results(finished_run, tmp_path):
    out = write(tmp_path / "out.csv", "keep me\n")
    to_score = write(tmp_path / "score.csv", "comment_id,text\n1,hello\n")
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(finished_run),
        "--input",
        str(to_score),
        "--output",
        str(out),
    )
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr
    assert out.read_text() == "keep me\n"
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(tmp_path),
        "--input",
        str(to_score),
        "--output",
        str(tmp_path / "new.csv"),
    )
    assert proc.returncode == 2 and "not a jaxtpu run directory" in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", str(finished_run), "--out", str(tmp_path))
    assert proc.returncode == 2 and "is not an empty directory" in proc.stderr


def test_an_ensemble_of_other_tasks_or_tokenizers_is_refused(tmp_path, minilm_dir):
    from types import SimpleNamespace

    from jaxtpu.predict import check_ensemble

    other_tok = tmp_path / "tok"
    from jaxtpu.core.data.tokens import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    tok.add_tokens(["zzzunseen"])
    tok.save_pretrained(other_tok)

    def model(task, tokenizer_dir):
        return SimpleNamespace(
            spec=SimpleNamespace(task=SimpleNamespace(name=task)), tokenizer_dir=tokenizer_dir
        )

    with pytest.raises(UserError, match="--workdir B is a ranking run, A a toxicity run"):
        check_ensemble([model("toxicity", minilm_dir), model("ranking", minilm_dir)], ["A", "B"])
    with pytest.raises(UserError, match="--workdir B has another tokenizer than A"):
        check_ensemble([model("toxicity", minilm_dir), model("toxicity", other_tok)], ["A", "B"])
    check_ensemble([model("toxicity", minilm_dir), model("toxicity", minilm_dir)], ["A", "B"])
