"""The slim server install against the full one: each into a fresh virtual environment, its
time and its size on disk.

`python -m benchmarks.deploy.installs [--out DIR]`

- slim: deploy/container/install.sh, the image recipe's Python part (pip, 'jaxtpu[serve-onnx]'
  at the newest lock's versions): what `jaxtpu serve --onnx` needs, no JAX, no torch;
- full: what `make setup` installs (uv, the Makefile's extras, the newest lock).

Both take wheels from this machine's caches when it has them (pip's and uv's), as a second
install on any machine does: the times are of installing, not of downloading; each row says
which installer ran. The environments are removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.shared.machine import cpu_line, cpu_record
from parity_tests.harness import ROOT


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _extras() -> str:
    text = (ROOT / "Makefile").read_text()
    extras = re.search(r"^EXTRAS := (.+)$", text, re.M)[1]
    return extras.replace("$(ACCEL)", "tpu")


def install(kind: str, venv: Path) -> dict[str, Any]:
    """Installs `kind` (slim or full) into a new `venv`: its row."""
    t0 = time.perf_counter()
    if kind == "slim":
        cmd = ["sh", "deploy/container/install.sh", str(venv), sys.executable]
        how = "pip: deploy/container/install.sh ('.[serve-onnx]', requirements/newest.txt)"
    else:
        uv = Path(sys.executable).parent / "uv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        cmd = [str(uv), "pip", "install", "--quiet", "--compile-bytecode", "--python", python,
               "-c", "requirements/newest.txt", f".[{_extras()}]"]  # fmt: skip
        how = f"uv: make setup's '.[{_extras()}]' (requirements/newest.txt)"
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    has = {
        m: subprocess.run(
            [str(venv / "bin" / "python"), "-c", f"import {m}"], capture_output=True
        ).returncode
        == 0  # fmt: skip
        for m in ("jax", "torch", "onnxruntime")
    }
    return {"install": kind, "how": how, "seconds": round(seconds, 1),
            "mib": round(_size(venv) / 2**20), "imports": has}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.deploy.installs", description=__doc__)
    p.add_argument("--out", default="runs/installs", help="where installs.json goes")
    p.add_argument("--keep", action="store_true", help="keep the two environments in --out")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out if args.keep else Path(tempfile.mkdtemp(prefix="jaxtpu-installs-"))
    rows = []
    try:
        for kind in ("slim", "full"):
            venv = base / kind
            shutil.rmtree(venv, ignore_errors=True)
            rows.append(install(kind, venv))
            print(f"{kind}: {rows[-1]['seconds']} s, {rows[-1]['mib']:,} MiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    result = {"rows": rows, "cpu": cpu_record()}
    (out / "installs.json").write_text(json.dumps(result, indent=1))
    print("| install | how | seconds | MiB on disk | jax | torch | onnxruntime |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        i = r["imports"]
        print(f"| {r['install']} | {r['how']} | {r['seconds']} | {r['mib']:,} | {i['jax']} | "
              f"{i['torch']} | {i['onnxruntime']} |")  # fmt: skip
    print(cpu_line(result["cpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
