"""``python -m cubepack`` and the ``cubepack`` command: the command line, with a Ctrl-C while
it loads (importing takes a moment) ending as one at any later moment does: one line, exit 130,
no traceback. Nothing has begun then, so there is nothing to undo."""

import sys


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the goodbye cannot be interrupted
        from .cli import interrupted

        return interrupted(sys.argv[1:])
    return run()


if __name__ == "__main__":
    sys.exit(main())
