"""mkdocs hook: the flag reference page is generated from the config schema (and the other
commands' flags from theirs) at build time, so it can never disagree with `--help`, and so are
the lists of flags that may change on --resume and that are jaxtpu's alone; the architecture
page's module map is generated from the modules' docstrings, so it names every module there is;
the home page is the README's front; a measured result's table is generated from the report
its check saved in docs/measured/."""

from __future__ import annotations


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201 (mkdocs' hook API)
    if "<!-- readme -->" in markdown:  # the home page is the README's front, never a copy
        from pathlib import Path

        readme = (Path(config["config_file_path"]).parent / "README.md").read_text()
        front = readme.split("\n## A quick tour")[0]
        markdown = markdown.replace(
            "<!-- readme -->", front.replace("](docs/", "](").replace("`docs/", "`")
        )
    if "<!-- flags -->" in markdown:
        from jaxtpu.core.flags.cli import flag_reference

        markdown = markdown.replace("<!-- flags -->", flag_reference())
    if "<!-- command-flags -->" in markdown:
        from jaxtpu.core.flags.commands import command_reference

        markdown = markdown.replace("<!-- command-flags -->", command_reference())
    for kind in ("resume", "jax-only"):
        if f"<!-- flags:{kind} -->" in markdown:
            from jaxtpu.core.flags.cli import flag_list

            markdown = markdown.replace(f"<!-- flags:{kind} -->", flag_list(kind))
    if "<!-- tpu-targets -->" in markdown:
        from jaxtpu.preflight.targets import targets_table

        markdown = markdown.replace("<!-- tpu-targets -->", targets_table())
    if "<!-- gpu-targets -->" in markdown:
        from jaxtpu.preflight.targets import gpu_targets_table

        markdown = markdown.replace("<!-- gpu-targets -->", gpu_targets_table())
    if "<!-- layers -->" in markdown:
        from devtools.codeshape import layers_table

        markdown = markdown.replace("<!-- layers -->", layers_table())
    if "<!-- measured:" in markdown:  # a saved report's table, never numbers copied by hand
        markdown = measured_tables(markdown, config)
    if "<!-- modules -->" in markdown:
        from devtools.codeshape import module_map

        markdown = markdown.replace("<!-- modules -->", module_map())
    return markdown


def measured_tables(markdown: str, config) -> str:  # noqa: ANN001 (mkdocs' config)
    """Each `<!-- measured:FILE -->` replaced by what `benchmarks.shared.measured.render` makes of
    `docs/measured/FILE`, a report a benchmark or check kept: its table, and when, where and
    by what command it was measured; `<!-- measured:A,B -->`: the rows of both in one table
    (`render_joined`)."""
    import re
    from pathlib import Path

    from benchmarks.shared.measured import MARKER, render_joined

    docs = Path(config["config_file_path"]).parent / "docs" / "measured"

    def one(match: re.Match) -> str:
        paths = [docs / name for name in match.group(1).split(",")]
        for path in paths:
            if not path.is_file():
                marker = f"<!-- measured:{match.group(1)} -->"
                raise ValueError(f"{marker}: no such report {path.name} in {docs}")
        return render_joined(paths)

    return re.sub(MARKER, one, markdown)
