#!/bin/sh
# The Python part of the image (deploy/container/Containerfile's build stage), also run by the
# tests (tests/test_serve.py) into a fresh virtual environment: jaxtpu's slim server,
# 'jaxtpu[serve-onnx]' (onnxruntime, the HTTP stack, a tokenizer; no JAX, no torch), at the
# versions of the newest lock. Run from the project's root: install.sh VENV [PYTHON]
set -eu
venv="$1"
python="${2:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -c requirements/newest.txt '.[serve-onnx]'
