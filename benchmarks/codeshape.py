"""The shape of the code, for the architecture reviews: modules per package with their line
counts, the longest functions and the largest classes, and the path a training run takes from
`jaxtpu/train.py` to the `jax.jit` of its train step (how many named calls, which files it
enters twice).

    python -m benchmarks.codeshape             # everything (the jit path trains the tiny preset)
    python -m benchmarks.codeshape --no-trace  # the static parts only

The jit path is traced, not read: `jax.jit` is wrapped while `jaxtpu.train.main` runs the
tiny preset for one step, and the first call that jits a function donating its first argument
(the train step: it donates the state) records the stack. Its frames from `jaxtpu/train.py` on
are the path, one frame per named call.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxtpu", "torchxla_ref", "parity_tests", "benchmarks", "tests")


def _sources(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def packages() -> list[tuple[str, int, int]]:
    """(package, modules, lines) for every package directory of the project."""
    counts: dict[str, list[int]] = {}
    for top in PACKAGES:
        for path in _sources(top):
            package = ".".join(path.parent.relative_to(ROOT).parts)
            modules, lines = counts.setdefault(package, [0, 0])
            counts[package] = [modules + 1, lines + _lines(path)]
    return [(name, m, n) for name, (m, n) in sorted(counts.items())]


MAPPED = ("jaxtpu", "torchxla_ref", "parity_tests", "benchmarks")


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    cut = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", paragraph)
    return paragraph[: cut.start() + 1] if cut else paragraph


def module_map() -> str:
    """The architecture page's module map: every package of the project with each of its
    modules and the first sentence of its docstring (what it owns), as markdown. Generated at
    docs build time (docs/hooks.py), so it names every module there is.

    Raises:
      ValueError: a module has no docstring (each file says what it owns).
    """
    out = []
    for top in MAPPED:
        packages: dict[str, list[str]] = {}
        for path in _sources(top):
            if path.name.startswith("test_") or path.name == "conftest.py":
                continue
            rel = path.relative_to(ROOT)
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            if not doc:
                raise ValueError(f"{rel} has no module docstring: say what it owns")
            name = "__init__" if path.name == "__init__.py" else path.stem
            line = f"| `{name}` | {first_sentence(doc)} |".replace("\n", " ")
            packages.setdefault("/".join(rel.parts[:-1]), []).append(line)
        for package, rows in packages.items():
            out += [f"### `{package}/`", "", "| module | what it owns |", "|---|---|", *rows, ""]
    return "\n".join(out)


def definitions(kind: type) -> list[tuple[int, str]]:
    """(lines, 'path:qualified name') of every function or class of the shipped packages."""
    found = []
    for top in PACKAGES[:-1]:
        for path in _sources(top):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            rel = path.relative_to(ROOT)
            stack: list[tuple[ast.AST, str]] = [(tree, "")]
            while stack:
                node, prefix = stack.pop()
                for child in ast.iter_child_nodes(node):
                    name = getattr(child, "name", None)
                    qual = f"{prefix}{name}." if name else prefix
                    if isinstance(child, kind):
                        size = child.end_lineno - child.lineno + 1
                        found.append((size, f"{rel}:{prefix}{name}"))
                    stack.append((child, qual))
    return sorted(found, reverse=True)


def jit_path() -> list[traceback.FrameSummary]:
    """The project frames from `jaxtpu/train.py` to the `jax.jit` of the train step."""
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import tempfile

    import jax

    from jaxtpu import train

    recorded: list[list[traceback.FrameSummary]] = []
    real_jit = jax.jit

    def recording_jit(fun, *args, **kwargs):
        if 0 in tuple(kwargs.get("donate_argnums", ())) and not recorded:  # donates the state
            recorded.append(traceback.extract_stack()[:-1])
        return real_jit(fun, *args, **kwargs)

    jax.jit = recording_jit
    try:
        with tempfile.TemporaryDirectory() as tmp:
            flags = ["--preset", "tiny", "--no-progress", "--max-steps", "1", "--workdir", tmp]
            train.main(flags)
    finally:
        jax.jit = real_jit
    if not recorded:
        raise SystemExit("no jax.jit of a train step (donate_argnums=(0,)) was seen")
    frames = recorded[0]
    start = min(i for i, f in enumerate(frames) if f.filename.endswith("jaxtpu/train.py"))
    return [f for f in frames[start:] if f.filename.startswith(str(ROOT))]


def reentered(frames: list[traceback.FrameSummary]) -> list[str]:
    """Files the path enters again after leaving them."""
    seen: list[str] = []
    again = []
    for f in frames:
        if seen and seen[-1] == f.filename:
            continue
        if f.filename in seen:
            again.append(f.filename)
        seen.append(f.filename)
    return sorted(set(again))


def _rel(path: str) -> str:
    return str(Path(path).relative_to(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-trace", action="store_true", help="skip the traced jit path")
    p.add_argument("--top", type=int, default=10, help="how many functions to list (default 10)")
    args = p.parse_args(argv)

    print("## Packages\n\n| package | modules | lines |\n|---|---|---|")
    rows = packages()
    for name, modules, lines in rows:
        print(f"| {name} | {modules} | {lines:,} |")
    total = sum(n for name, _, n in rows if not name.startswith("tests"))
    core = sum(n for name, _, n in rows if name.startswith("jaxtpu.core"))
    print(f"\nshipped lines {total:,}; jaxtpu.core {core:,} ({core / total:.0%})")
    print(f"\n## The {args.top} longest functions\n")
    for size, where in definitions((ast.FunctionDef, ast.AsyncFunctionDef))[: args.top]:
        print(f"- {size:4d} lines  {where}")
    print("\n## The 5 largest classes\n")
    for size, where in definitions(ast.ClassDef)[:5]:
        print(f"- {size:4d} lines  {where}")
    if not args.no_trace:
        frames = jit_path()
        outside = [f for f in frames if not f.filename.endswith("jaxtpu/train.py")]
        print(
            f"\n## From jaxtpu/train.py to jax.jit: {len(frames) - 1} calls, "
            f"{len(outside)} of them after leaving jaxtpu/train.py\n"
        )
        for f in frames:
            print(f"- {_rel(f.filename)}:{f.lineno} {f.name}")
        again = reentered(frames)
        print(f"\nfiles entered again after leaving them: {len(again)}")
        for path in again:
            print(f"- {_rel(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
