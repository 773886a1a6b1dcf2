"""jaxtpu's imports go one way (`benchmarks.codeshape.LAYERS`, docs/architecture.md "Layers"):
no module imports a layer above its own, no command imports another, imports inside functions
defer only heavy packages, and nothing forms a cycle (imports inside functions counted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import codeshape


def test_jaxtpu_imports_follow_the_layers_without_a_cycle():
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
        "jaxtpu.lrfind (line 1) imports jaxtpu.train: a command is a leaf; nothing imports it",
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


def test_no_module_of_jaxtpu_branches_on_a_layer_kind_outside_its_record():
    """What differs between layer kinds is read from `core.hf.kinds.LAYER_KINDS`: nowhere else
    in jaxtpu/ compares a kind (`layer_kind`, `kind.name`) with a name."""
    import ast

    found = []
    for path in sorted((codeshape.ROOT / "jaxtpu").rglob("*.py")):
        if path.name == "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                text = ast.unparse(node)
                names_a_kind = any(
                    isinstance(c, ast.Constant) and c.value in ("bert", "modernbert", "eurobert")
                    for c in [node.left, *node.comparators]
                )
                if names_a_kind and ("layer_kind" in text or "kind.name" in text):
                    found.append(f"{path.relative_to(codeshape.ROOT)}:{node.lineno}: {text}")
    assert found == []


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
