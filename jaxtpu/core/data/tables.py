"""Input files read as a stream of rows: CSV, Parquet and JSON Lines (framework-free).

A file is never held whole: its rows come one at a time (CSV and JSON Lines line by line,
Parquet one record batch at a time), so reading costs the memory of what the caller keeps, not
of the file. Every problem is one `DataError` line naming the file and, for a row, its line
(CSV: the line the row ends on; JSON Lines: its line; Parquet: "row N", the Nth data row).

The format is chosen by the file's suffix: `.parquet`/`.pq` (pyarrow), `.jsonl`/`.ndjson`
(one JSON object per line), anything else CSV. JSON Lines is read by the json module rather
than pyarrow's JSON reader: that one infers each column's type from the first block, so a
column blank (null) at the start and numeric further down fails half-way through a file. A
JSON Lines file's header is every key any of its records has (one pass over the file: a key
the first record leaves out, such as an optional `id`, is still a column); a record without
a key holds a blank there, as a short CSV row does.

Values: CSV gives text; Parquet and JSON Lines give their own types, handed on as text the
way a CSV would hold them (a number as its shortest round-trip form, a boolean as 1/0, a null
or NaN as blank), so one set of column rules and messages serves all three.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import DataError

PARQUET = (".parquet", ".pq")
JSONL = (".jsonl", ".ndjson")
BATCH = 8192  # Parquet rows per record batch
# The longest CSV field read, in characters. Python's csv module stops at 131,072 by default;
# Jigsaw's comments are at most about 5,000, a rules file's four examples with them a few times
# that, and a field of millions is almost always a quote left open that swallowed the file.
MAX_FIELD_CHARS = 10_000_000


def file_format(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    return "parquet" if suffix in PARQUET else "jsonl" if suffix in JSONL else "csv"


def as_text(value: Any) -> str:
    """A Parquet/JSON value as a CSV cell would hold it."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    return Structured(json.dumps(value))  # a list or object: no column rule accepts it


class Structured(str):
    """A list or object value of a Parquet/JSON file, as JSON text; marked so that a text
    column refuses it (`jaxtpu.core.data.readers`) rather than train on its JSON."""


@dataclass
class Table:
    """An input file: its header (column names, checked) and its rows, read on demand."""

    path: Path
    header: list[str]
    format: str

    def rows(self) -> Iterator[tuple[str, dict[str, str]]]:
        """(where, row) of each data row, `where` being "line N" or "row N"; a file with a
        header and no rows is refused when the stream ends."""
        count = 0
        for count, item in enumerate(_ROWS[self.format](self), 1):  # noqa: B007
            yield item
        if count == 0:
            names = ", ".join(self.header)
            raise DataError(f"{self.path}: has a header ({names}) but no data rows")


def open_table(path: str | os.PathLike) -> Table:
    """Opens an input file and reads its header, with errors that say what is wrong."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, expected a CSV, Parquet or JSON Lines file")
    fmt = file_format(p)
    if fmt != "parquet":
        _refuse_other_formats(p, fmt)
    header = _HEADERS[fmt](p)
    header = [h.strip() for h in header]
    repeated = sorted({h for h in header if h and header.count(h) > 1})
    if repeated:
        raise DataError(
            f"{p}: column {repeated[0]} appears {header.count(repeated[0])} times in the header; "
            "keep one column of each name"
        )
    return Table(p, header, fmt)


# The first bytes of compressed files, and how to get the text out of each.
COMPRESSED = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"PK\x03\x04": ("zip", "unzip"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
}


def _refuse_other_formats(p: Path, fmt: str) -> None:
    """A compressed file, or a JSON document where CSV or JSON Lines is read, is named for
    what it is (rather than "not UTF-8 text" or a CSV of one odd column)."""
    with _open(p) as f:
        head = f.read(4096)
    for magic, (kind, tool) in COMPRESSED.items():
        if head.startswith(magic):
            raise DataError(
                f"{p}: is {kind}-compressed; decompress it first ({tool} {p.name}) and pass "
                "the CSV, Parquet or JSON Lines file it holds"
            )
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"[") and (fmt == "jsonl" or p.suffix.lower() == ".json"):
        raise DataError(
            f"{p}: is one JSON array; jaxtpu reads JSON Lines (one object per line, "
            ".jsonl), CSV or Parquet: write one record per line"
        )
    if fmt == "csv" and p.suffix.lower() == ".json" and text.startswith(b"{"):
        first = text.split(b"\n", 1)[0].rstrip()
        if not first.endswith(b"}"):  # an object spread over lines: a JSON document
            raise DataError(
                f"{p}: is a JSON document; jaxtpu reads JSON Lines (one object per line, "
                ".jsonl), CSV or Parquet"
            )
        raise DataError(f"{p}: looks like JSON Lines; name it .jsonl so it is read as such")


def _open(p: Path) -> Any:
    try:
        return p.open("rb")
    except OSError as e:
        raise DataError(f"{p}: cannot be read ({e.strerror or e}); check its permissions") from None


# --------------------------------------------------------------------------- CSV


def _lines(p: Path) -> Iterator[str]:
    """The file's lines as text (each with its line ending, as the csv module wants them),
    decoded one at a time so that a byte that is not UTF-8 is named with its line."""
    with _open(p) as f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{p}: not UTF-8 text (byte 0x{raw[e.start]:02x} at line {number}); "
                    "re-save the file as UTF-8"
                ) from None


def _csv_reader(p: Path) -> Any:
    csv.field_size_limit(MAX_FIELD_CHARS)
    return csv.reader(_lines(p))


def _csv_error(p: Path, line: int, e: csv.Error) -> DataError:
    if "field larger than field limit" in str(e):
        return DataError(
            f"{p}: a field ending at line {line} is longer than {MAX_FIELD_CHARS:,} characters, "
            "the longest CSV field jaxtpu reads (a real comment is a few thousand); is a quote "
            "left open?"
        )
    return DataError(f"{p}: not a readable CSV at line {line}: {e}")


def _csv_header(p: Path) -> list[str]:
    reader = _csv_reader(p)
    try:
        for header in reader:
            if any(cell.strip() for cell in header):
                return header
    except csv.Error as e:
        raise _csv_error(p, reader.line_num, e) from None
    raise DataError(f"{p}: file is empty, expected a CSV header and rows")


def _csv_rows(table: Table) -> Iterator[tuple[str, dict[str, str]]]:
    reader = _csv_reader(table.path)
    names = table.header
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                break  # the header
        for cells in reader:
            if not cells:
                continue  # a blank line, as csv.DictReader skips it
            yield f"line {reader.line_num}", dict(zip(names, cells, strict=False))
    except csv.Error as e:
        raise _csv_error(table.path, reader.line_num, e) from None


# --------------------------------------------------------------------------- JSON Lines


def _json_objects(p: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(_lines(p), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}: line {number}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{p}: line {number}: not a JSON object, found {type(obj).__name__}")
        yield number, obj


def _jsonl_header(p: Path) -> list[str]:
    keys: dict[str, None] = {}  # in the order they first appear
    for _, obj in _json_objects(p):
        keys.update(dict.fromkeys(obj))
    if not keys:
        raise DataError(f"{p}: file is empty, expected one JSON object per line")
    return list(keys)


def _jsonl_rows(table: Table) -> Iterator[tuple[str, dict[str, str]]]:
    for number, obj in _json_objects(table.path):
        yield f"line {number}", {k: as_text(v) for k, v in obj.items()}


# --------------------------------------------------------------------------- Parquet


def _parquet(p: Path) -> Any:
    import pyarrow as pa  # lazy: only Parquet needs it
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(_open(p))
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{p}: not a readable Parquet file ({e})") from None


def _parquet_header(p: Path) -> list[str]:
    return list(_parquet(p).schema_arrow.names)


def _parquet_rows(table: Table) -> Iterator[tuple[str, dict[str, str]]]:
    import pyarrow as pa

    source = _parquet(table.path)
    number = 0
    try:
        for batch in source.iter_batches(batch_size=BATCH):
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", {k: as_text(v) for k, v in row.items()}
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{table.path}: not a readable Parquet file ({e})") from None


_HEADERS = {"csv": _csv_header, "jsonl": _jsonl_header, "parquet": _parquet_header}
_ROWS = {"csv": _csv_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows}
