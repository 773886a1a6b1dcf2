"""Train a tiny model and score text from Python, as a notebook does.

Run: python docs/examples/score.py RUN_DIR
"""

import sys

import jaxtpu
from jaxtpu.core.flags import presets
from jaxtpu.train import train_and_evaluate

workdir = sys.argv[1] if len(sys.argv) > 1 else "runs/from-python"
summary = train_and_evaluate(presets.tiny().replace(max_steps=10, workdir=workdir))
print(f"trained {summary['steps']} steps; best {summary['monitor']} {summary['best']['value']:.4f}")
model = jaxtpu.load(workdir)
for text, p in zip(
    ["thanks for the edit", "you are an idiot"],
    model.predict(["thanks for the edit", "you are an idiot"]),
    strict=True,
):
    print(f"{p:.4f}  {text}")
