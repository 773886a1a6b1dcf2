"""The sentences of a comment, for Perspective's `spanScores` (framework-free).

Perspective scored spans "currently done at per sentence level"; its clients are mostly
JavaScript, whose strings index UTF-16 code units, so `begin`/`end` are given in UTF-16 code
units of the request's text (the same as Python's string indices for text without characters
beyond the Basic Multilingual Plane, such as emoji, which count 2). A sentence ends after `.`,
`!`, `?` or `…` (and any closing quotes or brackets) followed by whitespace, or at a line
break; its span leaves out the whitespace around it, as Perspective's example does (`[0, 31)`
and `[32, 56)` for "What kind of idiot name is foo? Sorry, I like your name.").
"""

from __future__ import annotations

import re

_END = re.compile(r"[.!?\u2026]+[\"')\]\u201d\u2019]*(?=\s)|\n")


def sentences(text: str) -> list[tuple[int, int]]:
    """The sentences of `text` as [begin, end) code-point indices, whitespace left out; a text
    of whitespace alone has none."""
    spans, start = [], 0
    for m in _END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for a, b in spans:
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            lead = len(piece) - len(piece.lstrip())
            out.append((a + lead, a + lead + len(stripped)))
    return out


def utf16_offsets(text: str) -> list[int]:
    """For each code-point index 0..len(text), the UTF-16 code-unit index it starts at."""
    out, pos = [0], 0
    for ch in text:
        pos += 2 if ord(ch) > 0xFFFF else 1
        out.append(pos)
    return out


def sentence_spans(text: str) -> list[tuple[int, int, str]]:
    """(begin, end, sentence) for each sentence: begin/end in UTF-16 code units."""
    units = utf16_offsets(text)
    return [(units[a], units[b], text[a:b]) for a, b in sentences(text)]
