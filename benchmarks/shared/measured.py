"""Measured results, kept once: a benchmark's report as it wrote it, with when, where and by
what command it was measured, in one JSON file under docs/measured/; the docs' tables are
generated from those files and nothing else.

A benchmark run with `--report FILE` checks FILE as it starts (`start`) and writes it at the
end (`keep`): its own results (`report`), its kind, the command line, and where it ran
(`provenance`: the UTC date, the commit, and whether the working tree had changes, the CPU,
the Python and library versions). A page names the file
with `<!-- measured:FILE -->` and `docs/hooks.py` puts `render(FILE)` there: the kind's own
table function over the report, and a line saying when, on what and how it was measured;
`<!-- measured:A,B -->` joins the rows of several reports of one kind in one table
(`render_joined`). The prose around a table links to it instead of quoting its numbers
(`tests/test_docs.py`).

`python -m benchmarks.shared.measured FILE[,FILE...]...` prints what the docs will show for each
marker.
"""

from __future__ import annotations

import importlib
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.shared.machine import cpu_line, cpu_record
from jaxtpu.core import files, storage
from jaxtpu.core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]

# a report's kind -> its table function ("module:function", taking the report)
KINDS = {
    "bucket": "benchmarks.training.bucket:table",
    "compare": "benchmarks.training.compare:markdown",
    "epoch": "benchmarks.training.compare:epoch_markdown",
    "default_run": "benchmarks.training.default_run:table",
    "scoring": "benchmarks.serving.scoring:report_table",
    "device_check": "benchmarks.training.device_check:table",
    "decoders": "benchmarks.training.decoders:table",
    "rules": "benchmarks.quality.rules:table",
    "parity": "benchmarks.quality.parity:table",
    "competitions": "benchmarks.quality.competitions:table",
    "bias": "benchmarks.quality.competitions:bias_table",
    "calibration": "benchmarks.quality.calibration:table",
    "precisions": "benchmarks.training.precisions:table",
    "quality": "benchmarks.quality.buckets:table",
    "local_attention": "benchmarks.training.local_attention:table",
    "datascale": "benchmarks.training.datascale:table",
    "estimates": "benchmarks.training.estimates:report_table",
    "serving": "benchmarks.serving.throughput:table",
    "score_precision": "benchmarks.serving.score_precision:table",
    "tpu_tuning": "benchmarks.training.tpu_tuning:table",
    "preflight": "benchmarks.training.preflight_sweep:table",
    "community": "benchmarks.quality.community:table",
    "community_heads": "benchmarks.quality.community_heads:table",
    "languages": "benchmarks.serving.languages:table",
    "perspective_scale": "benchmarks.quality.perspective_scale:table",
    "archive": "benchmarks.deploy.archive:table",
}
# kinds whose figures are estimates (a cost model of a program compiled for hardware that is
# not here), never measurements: their caption says so
ESTIMATED = {"decoders", "estimates", "tpu_tuning", "preflight"}
# a page's marker: `<!-- measured:FILE -->`, or FILE,FILE... for one table of several
MARKER = r"<!-- measured:([\w.-]+(?:,[\w.-]+)*) -->"
# the distributions whose versions a report records (read from the installed metadata: no
# import, so recording costs nothing and a missing one is just absent)
VERSIONS = (
    "jax",
    "jaxlib",
    "libtpu",
    "flax",
    "torch",
    "torch_xla",
    "transformers",
    "onnxruntime",
    "orbax-checkpoint",
)


def commit() -> str:
    """The checked-out commit, '+changes' when tracked files differ from it; 'unknown'
    outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if status.stdout.strip() else "")


def other_code(commits: Sequence[str | None], code: str) -> str | None:
    """Why rows an earlier sitting computed at `commits` (None: a row that names none) cannot
    go into a report of this run's `code`, or None when they can: a report's caption names one
    commit, so a resumed run keeps only rows of that same commit, checked out clean."""
    if commits and (code.endswith("+changes") or code == "unknown"):
        return (f"this checkout ({code}) is not a commit, so an earlier sitting's rows cannot "
                "be shown to be its code: commit, then start afresh")  # fmt: skip
    other = sorted({c or "an unnamed commit" for c in commits} - {code})
    if other:
        return (f"it has rows computed at {', '.join(other)}, this run is at {code}, and a "
                "report's rows are one commit's: check out that commit to finish them, or "
                "start afresh")  # fmt: skip
    return None


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def provenance() -> dict[str, Any]:
    """Where and when this process measures: date (UTC), commit, CPU, Python, versions."""
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": commit(),
        "cpu": cpu_record(),
        "python": platform.python_version(),
        "versions": versions(),
    }


def start(path: str | Path | None, module: str) -> dict[str, Any] | None:
    """A benchmark's `--report FILE` checked before any work, and `provenance()` as the work
    starts (a commit made while it runs is not its code); None without a report. A path that
    cannot be written ends the benchmark here in one line (exit 2), not after hours of
    measuring."""
    if path is None:
        return None
    try:
        storage.check_output_path(Path(path), "--report")
    except UserError as e:
        print(f"{module}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return provenance()


def keep(
    path: str | Path,
    kind: str,
    report: Any,
    module: str,
    argv: Sequence[str] | None,
    when: dict[str, Any] | None = None,
) -> Path:
    """Writes the report file (atomically: a killed benchmark leaves the previous report
    whole): `report` (the benchmark's own results) as `kind`, measured by `python -m module
    argv` (None: this process's own arguments); `when`: `provenance()` as the benchmark
    started (a commit made while it ran is not its code), else now."""
    if kind not in KINDS:
        raise ValueError(f"no table for reports of kind {kind!r}; known: {', '.join(KINDS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "kind": kind,
        "command": shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]),
        "measured": when or provenance(),
        "report": report,
    }
    files.write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def show_and_keep(
    result: dict[str, Any],
    kind: str,
    module: str,
    path: str | Path | None,
    argv: Sequence[str] | None,
    when: dict[str, Any] | None,
) -> None:
    """A benchmark's end: its kind's table of `result` and the CPU it ran on, printed, and the
    report kept at `path` (its `--report`) when given."""
    print(_table_function(kind)(result))
    print(cpu_line(result["cpu"]))
    if path:
        print(f"{module}: kept {keep(path, kind, result, module, argv, when)}")


def kind_of(path: Path, record: dict[str, Any]) -> str:
    """A kept report names its kind; a device check's report written before reports were
    kept (the file itself, no envelope) is known by its file name."""
    if "kind" in record and "report" in record:
        return record["kind"]
    if path.name.startswith("device_check"):
        return "device_check"
    raise ValueError(
        f"{path}: not a kept report (no 'kind'); write it with the benchmark's --report"
    )


def caption(record: dict[str, Any], commands: Sequence[str] = ()) -> str:
    """The line under a table: when, at which commit, on what, with which command (`commands`:
    the several that made one table's rows, each its own process)."""
    m = record["measured"]
    v = m.get("versions", {})
    stack = ", ".join(
        f"{k} {v[k]}" for k in ("jax", "libtpu", "torch", "transformers", "onnxruntime") if k in v
    )
    what = "Estimated (not measured)" if record["kind"] in ESTIMATED else "Measured"
    again = "; ".join(f"`{c}`" for c in commands or [record["command"]])
    return (
        f"{what} {m['date']} at commit `{m['commit']}`; {cpu_line(m.get('cpu'))}; Python "
        f"{m['python']}{', ' + stack if stack else ''}. Again: {again}."
    )


def _table_function(kind: str) -> Any:
    module, function = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), function)


def render(path: str | Path) -> str:
    """What the docs show for a report file: its table and, for a kept report, its caption."""
    path = Path(path)
    record = json.loads(path.read_text())
    table = _table_function(kind_of(path, record))
    if "report" not in record:  # a bare device check report
        return table(record)
    return table(record["report"]) + "\n\n" + caption(record)


def render_joined(paths: Sequence[str | Path]) -> str:
    """One table of several kept reports of one kind whose reports are rows (each run in a
    process of its own, e.g. a TPU target per process: the compiler's memory grows with each
    program a process compiles): their rows in the files' order, and a caption per distinct
    sitting (date, commit, machine, versions) naming each of its commands. One file is
    `render`'s."""
    if len(paths) == 1:
        return render(paths[0])
    records = [json.loads(Path(p).read_text()) for p in paths]
    kinds = {kind_of(Path(p), r) for p, r in zip(paths, records, strict=True)}
    if len(kinds) != 1:
        raise ValueError(f"{', '.join(map(str, paths))}: one table needs one kind, not {kinds}")
    if not all(isinstance(r.get("report"), list) for r in records):
        raise ValueError(f"{', '.join(map(str, paths))}: only reports of rows join in one table")
    sittings: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        sittings.setdefault(json.dumps(r["measured"], sort_keys=True), []).append(r)
    captions = [caption(rs[0], [r["command"] for r in rs]) for rs in sittings.values()]
    rows = [row for r in records for row in r["report"]]
    return "\n\n".join([_table_function(kinds.pop())(rows), *captions])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    for name in args:
        try:
            print(render_joined(name.split(",")), end="\n\n")
        except FileNotFoundError:
            print(f"benchmarks.shared.measured: {name}: no such report", file=sys.stderr)
            return 2
        except (ValueError, KeyError) as e:  # not JSON, not a kept report, a kind unknown
            said = str(e) if name in str(e) else f"{name}: {e}"
            print(f"benchmarks.shared.measured: {said}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
