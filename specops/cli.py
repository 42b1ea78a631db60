"""The ``specops`` command line."""
import argparse


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backends available here and why (same as python -m specops)")
    args = parser.parse_args(argv)
    if args.command == "info":
        from .report import report

        print(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
