"""`jaxtpu feedback ACTION` (`python -m jaxtpu.feedback`): what `jaxtpu serve --feedback` kept
of comments:suggestscore. `delete --feedback URL --client-token T` removes one suggestion (a
user's erasure request).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.serving.feedback import Store, StoreError

ACTIONS = {"delete": "remove the suggestion of one clientToken"}


def usage() -> str:
    lines = ["usage: jaxtpu feedback ACTION [flags]   (jaxtpu feedback ACTION --help)", ""]
    lines += [f"  {name:<8} {text}" for name, text in ACTIONS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] not in ACTIONS:
        print(f"jaxtpu feedback: unknown action {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return delete(args[1:])


def delete(argv: Sequence[str]) -> int:
    parser = command_parser(
        "feedback delete",
        "Remove the suggestion a clientToken made (comments:suggestscore) from the store "
        "jaxtpu serve --feedback keeps them in.",
        epilog="Example: jaxtpu feedback delete --feedback feedback.db --client-token comment:1234",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("feedback delete", args)
        try:
            n = Store(args.feedback, create=False).delete(args.client_token)
        except StoreError as e:
            raise UserError(str(e)) from None
        if not n:
            raise UserError(
                f"--client-token {args.client_token}: no suggestion of it in --feedback "
                f"{args.feedback}; nothing removed"
            )
        print(f"removed the suggestion of clientToken {args.client_token}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
