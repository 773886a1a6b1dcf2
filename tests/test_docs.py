"""The documentation site: it builds in strict mode (a broken link fails the build), its flag
reference is the schema, the getting-started page's commands run as written, and the Python
example (what a notebook does) runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxtpu.core.flags.schema import FIELDS
from parity_tests.harness import ROOT, clean_env

pytest.importorskip("mkdocs", reason="the docs site needs mkdocs-material (the dev extra)")


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**clean_env(), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(root / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e
def test_the_site_builds_strictly_with_the_schemas_flag_reference(tmp_path):
    proc = _build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    flags = (tmp_path / "site" / "reference" / "flags" / "index.html").read_text()
    for name in FIELDS:
        assert f"--{name.replace('_', '-')}" in flags, name


@pytest.mark.e2e
def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", copy / "README.md")  # the home page is its front
    shutil.copytree(ROOT / "docs", copy / "docs")
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    proc = _build(copy, tmp_path / "site")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr


@pytest.mark.e2e
def test_the_getting_started_commands_run_as_written(tmp_path):
    text = (ROOT / "docs" / "getting-started.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) >= 7 and all(c.split()[0] in ("jaxtpu", "printf") for c in commands)
    bindir = str(Path(sys.executable).parent)  # the environment's jaxtpu console script
    if not (Path(bindir) / "jaxtpu").exists():
        pytest.skip(f"no jaxtpu console script in {bindir} (make setup installs it)")
    env = {**clean_env(), "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
    assert (tmp_path / "scores.csv").read_text().startswith("id,toxic")
    assert json.loads((tmp_path / "metrics.json").read_text())["metric"] == "auc"
    assert (tmp_path / "runs" / "again" / "summary.json").exists()
    assert (tmp_path / "exported" / "config.json").exists()


@pytest.mark.e2e
def test_the_python_example_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / "score.py"), str(tmp_path / "run")],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    scored = [line for line in proc.stdout.splitlines() if line.endswith("you are an idiot")]
    assert len(scored) == 1 and 0.0 < float(scored[0].split()[0]) < 1.0


# A test count or a CI time copied into prose goes stale with the next feature: the runs print
# their own (`.ci/run` each leg's time, pytest the count), docs/architecture.md "Tests in tiers".
_COPIED_FACTS = re.compile(
    r"\b\d[\d,]* (?:fast |new |end-to-end |e2e )?tests\b"
    r"|\b\d[\d,]* passed\b"
    r"|(?:\.ci/run|make test[\w-]*)`? (?:took|ran in|runs in) \d"
)


def test_the_docs_copy_no_test_count_or_ci_time():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        for m in _COPIED_FACTS.finditer(line)
    ]
    assert found == []
    # the check can fail: it finds what the docs used to say
    assert _COPIED_FACTS.search("the fast tier (684 tests in 45 s here)")
    assert _COPIED_FACTS.search("`.ci/run` took 1,713 s in all")


def test_a_measured_table_is_generated_from_the_report_its_check_saved():
    """Issue 64, item 7: a measured result in the docs is its check's saved report, rendered
    by the check's own table at build time (`<!-- measured:FILE -->`), never copied by hand."""
    import importlib.util

    from benchmarks.training.device_check import table

    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "gpu.md").read_text()
    assert "<!-- measured:device_check-h200.json -->" in page and "| fp32 | 2.6e-05" not in page
    config = {"config_file_path": str(ROOT / "mkdocs.yml")}
    built = hooks.on_page_markdown(page, None, config, None)
    report = json.loads((ROOT / "docs" / "measured" / "device_check-h200.json").read_text())
    assert table(report) in built and "<!-- measured:" not in built
    assert "| fp32 | 2.6e-05 (0.0001) | 0.0016 (0.001) | NO |" in built  # what it measured
    with pytest.raises(ValueError, match="no such report"):
        hooks.on_page_markdown("<!-- measured:no-such-report.json -->", None, config, None)
