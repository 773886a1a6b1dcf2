"""The layer-by-layer bisection proves itself: on a clean port every point passes; with a
porting bug planted in one layer of the JAX side, the report names that layer's point first
and nothing before it."""

from __future__ import annotations

import json

import pytest

from parity_tests import bisect
from parity_tests.harness import shared_init

FAULTY_LAYER = 2  # of 4: two clean layers before it, one after
EXPECTED = {
    "ln-eps": f"encoder.layer.{FAULTY_LAYER}.output",
    "gelu-tanh": f"encoder.layer.{FAULTY_LAYER}.intermediate",
    "transposed-kernel": f"encoder.layer.{FAULTY_LAYER}.attention",
}


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("bisect") / "tiny4"
    return shared_init(out, "toxicity", "tiny", seed=1, num_layers=4)


def run(model_dir, csv, out, *extra):
    code = bisect.main(
        [
            "--model-dir",
            str(model_dir),
            "--csv",
            str(csv),
            "--n",
            "8",
            "--max-len",
            "48",
            "--out",
            str(out),
            *extra,
        ]
    )
    return code, json.loads((out / "bisect.json").read_text())


@pytest.mark.e2e
def test_a_clean_port_passes_every_point(four_layers, real_data, tmp_path):
    code, report = run(four_layers, real_data, tmp_path)
    forward, grads = report["forward"][0], report["gradients"][0]
    assert len(forward["rows"]) == 1 + 3 * 4 + 2  # embeddings, 4 x 3 per layer, pooler, head
    assert forward["first_failure"] is None and grads["first_failure"] is None, report
    assert code == 0 and (tmp_path / "bisect.png").stat().st_size > 0


@pytest.mark.e2e
@pytest.mark.parametrize("fault", list(EXPECTED))
def test_a_planted_fault_is_named_and_nothing_before_it(four_layers, real_data, tmp_path, fault):
    code, report = run(four_layers, real_data, tmp_path, "--plant-fault", f"{fault}:{FAULTY_LAYER}")
    rows = report["forward"][0]["rows"]
    points = [r["point"] for r in rows]
    at = points.index(EXPECTED[fault])
    assert report["forward"][0]["first_failure"] == EXPECTED[fault], rows
    assert all(r["passed"] for r in rows[:at]) and not rows[at]["passed"]
    assert code == 1
