"""The imports of jaxtpu/, torchxla_ref/, parity_tests/ and benchmarks/ go one way
(`devtools.codeshape.LAYERS`, docs/architecture.md "Layers"): no module imports a layer above
its own, nothing in the libraries imports a command, the JAX side imports the reference only
where `REFERENCE_IMPORTS` says why, the libraries' imports inside functions defer only heavy
packages, and nothing forms a cycle (imports inside functions counted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import codeshape


def test_the_imports_follow_the_layers_without_a_cycle():
    assert codeshape.import_cycles() == []
    assert codeshape.layer_violations() == []


def test_every_module_has_a_layer_and_the_commands_are_the_top_level_modules():
    assert codeshape.LAYERS[codeshape.layer_of("jaxtpu.train")][0] == "commands"
    assert codeshape.LAYERS[codeshape.layer_of("jaxtpu.preflight.fit")][0] == "commands"
    assert codeshape.command_of("jaxtpu.preflight.fit") == "jaxtpu.preflight"
    assert codeshape.LAYERS[codeshape.layer_of("jaxtpu.engine.parallel")][0] == "engine"
    assert codeshape.LAYERS[codeshape.layer_of("jaxtpu.core.run.loop")][0] == "core.run"
    assert codeshape.LAYERS[codeshape.layer_of("jaxtpu.core.errors")][0] == "core"
    assert codeshape.command_of("jaxtpu.engine.parallel") is None
    # every shipped package has its place: the harnesses above the commands, the reference
    # between the Flax layers and jaxtpu.core
    names = [name for name, _, _ in codeshape.LAYERS]
    assert codeshape.LAYERS[codeshape.layer_of("benchmarks.training.compare")][0] == "benchmarks"
    assert codeshape.LAYERS[codeshape.layer_of("parity_tests.checks")][0] == "parity_tests"
    ref = names.index(codeshape.LAYERS[codeshape.layer_of("torchxla_ref.models")][0])
    assert names.index("models") < ref < names.index("core.run")
    assert codeshape.command_of("torchxla_ref.train") is None


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_find_a_cycle_an_upward_import_a_command_import_and_a_needless_deferral(
    tmp_path,
):
    root = _tree(
        tmp_path,
        {
            "jaxtpu/__init__.py": "",
            "jaxtpu/train.py": "from jaxtpu.engine import parallel\n",
            "jaxtpu/lrfind.py": "from jaxtpu import train\n",  # a command imports a command
            "jaxtpu/engine/__init__.py": "",
            "jaxtpu/engine/parallel.py": "import jax\nfrom jaxtpu.core import files\n",
            "jaxtpu/core/__init__.py": "",
            # upward: core imports the engine; and a cycle with it through the function below
            "jaxtpu/core/files.py": "def f():\n    from jaxtpu.engine import parallel\n",
            "jaxtpu/core/errors.py": "",
            # the JAX side imports the reference: only a REFERENCE_IMPORTS module may
            "jaxtpu/engine/steps.py": "def h():\n    from torchxla_ref import models\n",
            "torchxla_ref/__init__.py": "",
            "torchxla_ref/models.py": "import torch\nfrom jaxtpu.engine import parallel\n",
            "parity_tests/__init__.py": "",
            "parity_tests/checks.py": "from benchmarks import compare\n",  # a harness above
            "benchmarks/__init__.py": "",
            "benchmarks/compare.py": "from jaxtpu import train\n",  # a harness runs commands
            "jaxtpu/core/tasks.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from jaxtpu.engine import parallel\n"  # not counted
                "def g():\n    from jaxtpu.core import errors\n"  # defers nothing heavy
            ),
        },
    )
    assert codeshape.import_cycles(root) == [["jaxtpu.core.files", "jaxtpu.engine.parallel"]]
    found = codeshape.layer_violations(root)
    assert found == [
        "jaxtpu.core.files (line 2) imports jaxtpu.engine.parallel: layer engine is above core",
        "jaxtpu.core.tasks (line 5) imports jaxtpu.core.errors inside a function: it defers no "
        "heavy package; import it at the top",
        "jaxtpu.engine.steps (line 2) imports torchxla_ref.models: the JAX side imports the "
        "reference (not in REFERENCE_IMPORTS)",
        "jaxtpu.lrfind (line 1) imports jaxtpu.train: a command is a leaf; nothing imports it",
        "parity_tests.checks (line 1) imports benchmarks.compare: layer benchmarks is above "
        "parity_tests",
        "torchxla_ref.models (line 2) imports jaxtpu.engine.parallel: layer engine is above "
        "torchxla_ref",
    ]


def test_a_deferred_import_of_a_module_that_brings_jax_and_a_lazy_attribute_are_allowed(
    tmp_path,
):
    root = _tree(
        tmp_path,
        {
            "jaxtpu/__init__.py": "def __getattr__(name):\n    from jaxtpu.api import load\n",
            "jaxtpu/api.py": "from jaxtpu.engine import backend\n",
            "jaxtpu/train.py": "def main():\n    from jaxtpu.engine import backend\n",
            "jaxtpu/engine/__init__.py": "",
            "jaxtpu/engine/backend.py": "from jaxtpu.engine import steps\n",
            "jaxtpu/engine/steps.py": "import jax.numpy as jnp\n",  # heavy, one step away
        },
    )
    assert codeshape.layer_violations(root) == []
    assert codeshape.import_cycles(root) == []


def _kind_comparisons(root: Path) -> list[str]:
    """Comparisons of a layer kind (`layer_kind`, `kind.name`, ...) with a kind's name, read
    from the kind records, in jaxtpu/ and torchxla_ref/ outside `core/hf/kinds.py`."""
    import ast

    from jaxtpu.core.hf.kinds import LAYER_KINDS

    found = []
    for top in ("jaxtpu", "torchxla_ref"):
        for path in sorted((root / top).rglob("*.py")):
            if path.name == "kinds.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                named = [c.value for c in sides if isinstance(c, ast.Constant)]
                for c in sides:  # `kind.name in ("bert", ...)`
                    if isinstance(c, ast.Tuple | ast.List | ast.Set):
                        named += [e.value for e in c.elts if isinstance(e, ast.Constant)]
                text = ast.unparse(node)
                if set(named) & set(LAYER_KINDS) and "kind" in text:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    return found


def test_no_module_branches_on_a_layer_kind_outside_its_record(tmp_path):
    """What differs between layer kinds is read from `core.hf.kinds.LAYER_KINDS`: nowhere else
    in jaxtpu/ or torchxla_ref/ compares a kind with a name; the names are the records' own, so
    a new kind (the decoders' was the fourth) is covered without editing this test."""
    assert _kind_comparisons(codeshape.ROOT) == []
    root = _tree(
        tmp_path,
        {
            "jaxtpu/a.py": "def f(spec):\n    return spec.layer_kind == 'decoder'\n",
            "torchxla_ref/b.py": "def g(kind):\n    return kind.name in ('eurobert', 'x')\n",
        },
    )
    assert _kind_comparisons(root) == [
        "jaxtpu/a.py:2: spec.layer_kind == 'decoder'",
        "torchxla_ref/b.py:2: kind.name in ('eurobert', 'x')",
    ]


@pytest.mark.e2e
def test_importing_a_command_starts_no_framework():
    """A command's module imports jax, flax, orbax, torch and transformers only when it runs:
    its --help is quick, and its logging is set up before any of them logs (absl's first log
    line would otherwise give Python's root logger a handler of its own, and jaxtpu's lines
    would never reach stdout)."""
    import subprocess
    import sys

    modules = [
        "jaxtpu.train", "jaxtpu.predict", "jaxtpu.evaluate", "jaxtpu.export", "jaxtpu.severity",
        "jaxtpu.lrfind", "jaxtpu.launch", "jaxtpu.preflight.command", "jaxtpu.api",
    ]  # fmt: skip
    code = (
        f"import sys, logging\nimport {', '.join(modules)}\n"
        "heavy = ('jax', 'flax', 'orbax', 'torch', 'transformers')\n"
        "print([m for m in heavy if m in sys.modules], logging.getLogger().handlers)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[] []"
