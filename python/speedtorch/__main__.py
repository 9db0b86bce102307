"""Command line: `python -m speedtorch info | demo | transfer-demo | engram-demo`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m speedtorch {info,demo,transfer-demo,engram-demo} [options]  (demo --help for its "
             "options)\n"
             "  info           versions, build, GPUs and their PCIe links, host RAM, pinned-copy bandwidth (GPU)\n"
             "  demo           trains a recommender with its user table in pinned host RAM (the main job)\n"
             "  transfer-demo  gathers/scatters batches of rows, speedtorch against plain torch\n"
             "  engram-demo    trains a small GPT with Engram tables in host RAM on the standard library's bytes")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "info":
        from .cli.info import __doc__ as about, report

        # No options, but argparse gives --help and rejects anything else instead of ignoring it.
        argparse.ArgumentParser(prog="python -m speedtorch info", description=about).parse_args(rest)
        print(report())
        return 0
    if command == "demo":
        from .cli.train_demo import main as demo

        return demo(rest)
    if command == "engram-demo":
        from .models.engram_gpt import main as engram_demo

        return engram_demo(rest)
    if command == "transfer-demo":
        from .cli.transfer_demo import main as transfer_demo

        return transfer_demo(rest)
    print(f"unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
