"""`devtools.codeshape`: the architecture page's module map and the review's measurements."""

from __future__ import annotations

import traceback

import pytest

from devtools import codeshape


def test_the_module_map_names_every_shipped_module_with_its_docstring():
    text = codeshape.module_map()
    for top in codeshape.MAPPED:
        for path in codeshape._sources(top):
            if path.name.startswith("test_") or path.name == "conftest.py":
                continue
            name = "__init__" if path.name == "__init__.py" else path.stem
            package = "/".join(path.relative_to(codeshape.ROOT).parts[:-1])
            section = text.split(f"### `{package}/`")[1].split("### ")[0]
            assert f"| `{name}` |" in section, (package, name)


def test_a_module_without_a_docstring_fails_the_map(tmp_path, monkeypatch):
    (tmp_path / "jaxtpu").mkdir()
    (tmp_path / "jaxtpu" / "said.py").write_text('"""Owns this. And more."""\n')
    (tmp_path / "jaxtpu" / "silent.py").write_text("x = 1\n")
    monkeypatch.setattr(codeshape, "ROOT", tmp_path)
    monkeypatch.setattr(codeshape, "MAPPED", ("jaxtpu",))
    with pytest.raises(ValueError, match="jaxtpu/silent.py has no module docstring"):
        codeshape.module_map()
    (tmp_path / "jaxtpu" / "silent.py").write_text('"""Now it says, e.g. this.\n\nMore."""\n')
    assert "| `silent` | Now it says, e.g. this. |" in codeshape.module_map()
    assert "| `said` | Owns this. |" in codeshape.module_map()


def test_reentered_names_a_file_the_path_comes_back_to():
    def frame(name: str) -> traceback.FrameSummary:
        return traceback.FrameSummary(name, 1, "f")

    path = [frame("a.py"), frame("a.py"), frame("b.py"), frame("c.py"), frame("b.py")]
    assert codeshape.reentered(path) == ["b.py"]
    assert codeshape.reentered(path[:4]) == []


def test_no_function_or_module_of_the_shipped_packages_is_over_its_limit():
    """Issue 64, items 4 and 6: no function over 80 lines, no module over 600 in jaxtpu/,
    torchxla_ref/, parity_tests/ and benchmarks/ (the tables in `codeshape.TABLES` excepted,
    each with its reason), no command over 200; split by job instead (docs/architecture.md)."""
    assert codeshape.over_limits() == []
    for path, why in codeshape.TABLES.items():
        assert (codeshape.ROOT / path).exists() and len(why) > 40, path


def test_the_limits_find_a_long_function_and_a_long_module(tmp_path):
    (tmp_path / "jaxtpu").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "jaxtpu" / "long.py").write_text(f"def f():\n{body}\n\ndef g():\n    pass\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "big.py").write_text("x = 1\n" * 601)
    (tmp_path / "jaxtpu" / "serve").mkdir()
    (tmp_path / "jaxtpu" / "serve" / "command.py").write_text("x = 1\n" * 201)
    (tmp_path / "jaxtpu" / "serve" / "app.py").write_text("x = 1\n" * 201)  # not a command
    (tmp_path / "jaxtpu" / "api.py").write_text("x = 1\n" * 201)  # the Python API
    assert codeshape.over_limits(tmp_path) == [
        "jaxtpu/long.py:f: 81 lines, over 80 for a function",
        "benchmarks/big.py: 601 lines, over 600 for a module",
        "jaxtpu/serve/command.py: 201 lines, over 200 for a command",
    ]
    assert [p.name for p in codeshape.commands()][:3] == ["evaluate.py", "export.py", "feedback.py"]
