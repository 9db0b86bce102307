"""Command line: `python -m speedtorch info | demo`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m speedtorch {info,demo} [options]  (demo --help for its options)"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "info":
        from .info import report

        print(report())
        return 0
    if command == "demo":
        from .transfer_demo import main as demo

        return demo(rest)
    print(f"unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
