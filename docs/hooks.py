"""mkdocs hook: the flag reference page is generated from the config schema at build time, so
it can never disagree with `--help`."""

from __future__ import annotations


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201 (mkdocs' hook API)
    if "<!-- flags -->" not in markdown:
        return markdown
    from jaxtpu.core.flags.cli import flag_reference

    return markdown.replace("<!-- flags -->", flag_reference())
