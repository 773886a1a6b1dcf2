"""`jaxtpu shadow report` (`python -m jaxtpu.shadow report`): how the model in shadow of a
server (`jaxtpu serve --shadow RUN`) compares with the one answering, from the server's
record (`GET /v1/shadow`), as a table per attribute (`jaxtpu.core.serving.shadow.table`)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.serving.shadow import table


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "report":
        print("usage: jaxtpu shadow report [--url URL] [--key KEY] [--json]", file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    parser = command_parser(
        "shadow report",
        "Print how the model in shadow compares with the one answering (jaxtpu serve --shadow "
        "RUN; with --shadow-communities DIR, each community's candidate head against what "
        "answers that community), per attribute: mean absolute difference, rank correlation, "
        "and at 0.5, 0.7, 0.8 and 0.9 how many comments each model puts at or above and how "
        "many change side.",
    )
    flags = parser.parse_args(args[1:])
    with user_errors():
        check_command_flags("shadow report", flags)
        report = fetch(flags.url, flags.key)
        print(json.dumps(report, indent=1) if flags.json else table(report))
    return 0


def fetch(url: str, key: str | None) -> dict:
    """The server's shadow record, or one line saying why not."""
    headers = {"X-Goog-Api-Key": key} if key else {}
    req = urllib.request.Request(url.rstrip("/") + "/v1/shadow", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = e.reason
        raise UserError(f"--url {url}: {e.code} {message}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"--url {url}: cannot reach it ({reason})") from None


if __name__ == "__main__":
    sys.exit(main())
