"""The shape of the code, for the architecture reviews: modules per package with their line
counts, the longest functions and the largest classes, and the path a training run takes from
`jaxtpu/train.py` to the `jax.jit` of its train step (how many named calls, which files it
enters twice).

    python -m devtools.codeshape             # everything (the jit path trains the tiny preset)
    python -m devtools.codeshape --no-trace  # the static parts only

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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The shipped packages (what the module map and the limits cover) and, with them, the tests.
SHIPPED = ("jaxtpu", "torchxla_ref", "parity_tests", "benchmarks", "devtools")
PACKAGES = (*SHIPPED, "tests")


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


MAPPED = SHIPPED


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


def definitions(kind: type, root: Path | None = None) -> list[tuple[int, str]]:
    """(lines, 'path:qualified name') of every function or class of the shipped packages."""
    root = root or ROOT
    found = []
    for top in SHIPPED:
        for path in sorted(p for p in (root / top).rglob("*.py") if ".venv" not in p.parts):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            rel = path.relative_to(root)
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


# The limits of issue 64 (item 6), held by tests/test_codeshape.py: no function of the shipped
# packages over FUNCTION_LINES lines, no module over MODULE_LINES, but for the tables named
# here with the reason each is one.
FUNCTION_LINES = 80
MODULE_LINES = 600
# A command's module parses, checks, calls the library and says what it did: no more lines
# than this (issue 64, item 4). The commands: jaxtpu/X.py and jaxtpu/X/command.py.
COMMAND_LINES = 200
NOT_COMMANDS = ("__init__.py", "__main__.py", "api.py")  # the package and the Python API
TABLES = {
    "jaxtpu/core/flags/schema.py": (
        "the flag table: every flag of a run is a field of its section's dataclass with its "
        "help, bounds, side and resume policy, from which --help, the checks and the flag "
        "reference are generated; split, one table would be several"
    ),
}


def over_limits(root: Path | None = None) -> list[str]:
    """What crosses the limits, one line each: a function over `FUNCTION_LINES` lines, a
    module over `MODULE_LINES` (the `TABLES` excepted), a command over `COMMAND_LINES`."""
    root = root or ROOT
    out = [
        f"{where}: {size} lines, over {FUNCTION_LINES} for a function"
        for size, where in definitions((ast.FunctionDef, ast.AsyncFunctionDef), root)
        if size > FUNCTION_LINES
    ]
    for top in SHIPPED:
        for path in sorted(p for p in (root / top).rglob("*.py") if ".venv" not in p.parts):
            rel = path.relative_to(root).as_posix()
            lines = _lines(path)
            if lines > MODULE_LINES and rel not in TABLES:
                out.append(f"{rel}: {lines} lines, over {MODULE_LINES} for a module")
    for path in commands(root):
        lines = _lines(path)
        if lines > COMMAND_LINES:
            rel = path.relative_to(root).as_posix()
            out.append(f"{rel}: {lines} lines, over {COMMAND_LINES} for a command")
    return out


def commands(root: Path | None = None) -> list[Path]:
    """The commands' modules: `jaxtpu/X.py` (but the package's and the API's) and a command
    package's `jaxtpu/X/command.py`."""
    top = (root or ROOT) / "jaxtpu"
    found = [p for p in sorted(top.glob("*.py")) if p.name not in NOT_COMMANDS]
    return found + sorted(top.glob("*/command.py"))


# The layers, top to bottom, each a set of module-name prefixes (a module belongs to the layer
# of its longest matching prefix): a module imports modules of its own layer and of the layers
# below it, never above, and the imports (those inside functions too) form no cycle. The
# harnesses (benchmarks, parity_tests) sit above the commands they run; the PyTorch reference
# (torchxla_ref) sits on jaxtpu.core alone, below the JAX side it is checked against.
# docs/architecture.md ("Layers") shows this table; tests/test_layers.py holds the code to it.
LAYERS = (
    ("benchmarks", "measurements of both sides: run by hand, never imported", ("benchmarks",)),
    (
        "devtools",
        "what the tests and benchmarks use that measures nothing: this checker, a GCS emulator",
        ("devtools",),
    ),
    ("parity_tests", "the checks that both sides compute the same thing", ("parity_tests",)),
    ("commands", "what a user runs (`python -m jaxtpu.X`, `jaxtpu X`): leaves", ("jaxtpu",)),
    ("api", "the Python API (`jaxtpu.load`)", ("jaxtpu.api",)),
    ("engine", "the JAX engine the commands drive", ("jaxtpu.engine",)),
    ("models", "the Flax layers", ("jaxtpu.models",)),
    ("torchxla_ref", "the PyTorch reference, on jaxtpu.core alone", ("torchxla_ref",)),
    ("core.run", "the loop both sides share and its run directory", ("jaxtpu.core.run",)),
    ("core.data", "what a run reads", ("jaxtpu.core.data",)),
    ("core.flags", "what a run is asked to do", ("jaxtpu.core.flags",)),
    ("core.hf", "Hugging Face checkpoints and the family table", ("jaxtpu.core.hf",)),
    ("core", "framework-free facts and helpers every room uses", ("jaxtpu.core",)),
)
# The JAX side builds no torch model of its own, with these exceptions (each with its reason):
# an import of the reference by a jaxtpu module not named here is a violation.
REFERENCE_IMPORTS = {
    "jaxtpu.engine.exports": (
        "--format onnx: torch.onnx exports a torch module, so the graph is traced from the "
        "reference's model with the run's weights, then checked against jaxtpu's logits"
    ),
}
# Imported inside a function to defer them (start-up time, optional extras); a jaxtpu module
# may be imported inside a function only when it imports one of these at its top, or inside a
# module's own `__getattr__` (PEP 562: `jaxtpu.load` keeps `import jaxtpu` light).
HEAVY = (
    "jax",
    "flax",
    "optax",
    "orbax",
    "torch",
    "torch_xla",
    "transformers",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "gcsfs",
    "google",
    "tensorstore",
    "wandb",
    "tensorboardX",
    "starlette",  # jaxtpu[serve]
    "uvicorn",
    "prometheus_client",
)


@dataclass(frozen=True)
class Import:
    """One import of a jaxtpu module by another: where it is and whether it sits inside a
    function (deferred) or at the module's top."""

    source: str
    target: str
    line: int
    deferred: bool
    lazy_attribute: bool = False  # inside the module's own `__getattr__` (PEP 562)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> tuple[list[Import], set[str]]:
    """The jaxtpu modules `path` imports (`from jaxtpu.x import y` names module `jaxtpu.x.y`
    when that is a module, else `jaxtpu.x`) and the top-level packages it imports at its top,
    `if TYPE_CHECKING:` blocks left out (they run only under a type checker)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, top_packages = [], set()

    def visit(node: ast.AST, deferred: bool, lazy: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            inner = deferred or function
            inner_lazy = lazy or (function and node is tree and child.name == "__getattr__")
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in child.names
                ]
            else:
                visit(child, inner, inner_lazy)
                continue
            for target in targets:
                if not deferred:
                    top_packages.add(target.split(".")[0])
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    found.append(Import(name, target, child.lineno, deferred, lazy))

    tree = ast.parse(path.read_text(encoding="utf-8"))
    visit(tree, False)
    return found, top_packages


def import_graph(root: Path = ROOT) -> tuple[list[Import], dict[str, set[str]]]:
    """Every import between the modules of the shipped packages under `root`, and each
    module's top-level packages."""
    paths = [p for top in SHIPPED for p in sorted((root / top).rglob("*.py"))]
    modules = {module_name(p, root) for p in paths}
    edges, tops = [], {}
    for path in paths:
        found, top = imports_of(path, root, modules)
        edges += found
        tops[module_name(path, root)] = top
    return edges, tops


def layer_of(module: str) -> int:
    """The index in `LAYERS` (0 = the top) of the layer `module` belongs to."""
    best, depth = len(LAYERS) - 1, -1
    for i, (_, _, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = i, len(prefix)
    return best


def command_of(module: str) -> str | None:
    """The command a module of the commands layer belongs to: `jaxtpu.X` for a module or
    package right under jaxtpu/ (`jaxtpu.preflight.fit` is preflight's); None for the
    package itself."""
    if module == "jaxtpu" or LAYERS[layer_of(module)][0] != "commands":
        return None
    return ".".join(module.split(".")[:2])


def layer_violations(root: Path = ROOT) -> list[str]:
    """What breaks the layer order, one line each: an import of a higher layer, of another
    command, or inside a function of a jaxtpu module that defers no heavy package."""
    edges, tops = import_graph(root)

    def heavy(module: str, seen: set[str]) -> bool:
        if module in seen:
            return False
        seen.add(module)
        if tops.get(module, set()) & set(HEAVY):
            return True
        return any(heavy(e.target, seen) for e in edges if e.source == module and not e.deferred)

    out = []
    for e in sorted(set(edges), key=lambda e: (e.source, e.line, e.target)):
        where = f"{e.source} (line {e.line}) imports {e.target}"
        src, dst = layer_of(e.source), layer_of(e.target)
        inside = e.source.split(".")[0] in ("jaxtpu", "torchxla_ref")  # the libraries
        if dst < src:
            out.append(f"{where}: layer {LAYERS[dst][0]} is above {LAYERS[src][0]}")
        elif command_of(e.target) and command_of(e.target) != command_of(e.source):
            if inside and e.source != "jaxtpu":
                out.append(f"{where}: a command is a leaf; nothing imports it")
        if (
            e.source.startswith("jaxtpu")
            and e.target.startswith("torchxla_ref")
            and e.source not in REFERENCE_IMPORTS
        ):
            out.append(f"{where}: the JAX side imports the reference (not in REFERENCE_IMPORTS)")
        if inside and e.deferred and not e.lazy_attribute and not heavy(e.target, set()):
            out.append(
                f"{where} inside a function: it defers no heavy package; import it at the top"
            )
    return out


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The cycles among jaxtpu's modules, imports inside functions counted: each strongly
    connected set of two or more modules, sorted."""
    edges, _ = import_graph(root)
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def layers_table() -> str:
    """docs/architecture.md's table of `LAYERS`, top to bottom."""
    rows = ["| layer | what | modules |", "|---|---|---|"]
    for name, what, prefixes in LAYERS:
        shown = ", ".join(f"`{p}`" for p in prefixes)
        rows.append(f"| {name} | {what} | {shown} |")
    return "\n".join(rows)


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
