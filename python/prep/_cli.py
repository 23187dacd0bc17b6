"""The `prep` command of the pip package: a console script
(pyproject.toml, `[project.scripts]`) that runs the command line compiled
into the extension module prep._native, the same source as the binary's
(src/cli). It imports the extension and the package's __init__, which
imports nothing more (see there): `prep --help` needs neither numpy nor
torch.
"""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Runs `prep` with this process's arguments and exits with its status."""
    # Python turns SIGINT into KeyboardInterrupt, raised between bytecodes,
    # and none run while the command does (Rust, the GIL released), so
    # Ctrl-C would wait for the command to end. The command handles SIGINT
    # and SIGTERM itself, as the binary does (a line saying what to do
    # next, exit status 130 or 143); until it has started, the default
    # action ends the process. SIGPIPE stays ignored, as Python and Rust's
    # runtime both leave it: a write to a closed pipe fails with EPIPE,
    # which the command treats as the end of its output (`prep inspect |
    # head` exits 0, quietly).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # argv[0] is the script's path, whose file name (`prep`) clap shows in
    # the usage, as the binary's.
    sys.exit(_native.main(sys.argv, handle_signals=True))
