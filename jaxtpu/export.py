"""`python -m jaxtpu.export`: write a run's best model as a Hugging Face directory.

The directory loads in PyTorch with `transformers.AutoModel.from_pretrained(DIR)` (encoder)
plus `head.safetensors` (`nn.Linear(hidden, 1)`), or whole with
`torchxla_ref.models.load_pretrained(DIR)`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxtpu.core.rundir import check_output_path, user_errors


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m jaxtpu.export",
        description="Export the best checkpoint of a run as a Hugging Face BERT directory.",
    )
    p.add_argument("--workdir", required=True, help="Run directory written by jaxtpu.train.")
    p.add_argument("--out", required=True, help="New (or empty) directory to write.")
    args = p.parse_args(argv)
    with user_errors():
        from jaxtpu import weights
        from jaxtpu.predict import load_trained

        out = Path(args.out)
        check_output_path(out, "--out", is_dir=True)
        model = load_trained(args.workdir)
        head = {
            "task": model.cfg.run.task,
            "head_dropout": model.cfg.head_dropout,
            "step": model.meta.get("step"),
            "metrics": {k: v for k, v in model.meta.items() if k.startswith("val_")},
        }
        weights.save_hf(model.params, model.encoder, out, model.tokenizer_dir, head)
        print(f"exported step {head['step']} ({model.cfg.run.task}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
