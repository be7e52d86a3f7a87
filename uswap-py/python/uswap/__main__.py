"""``python -m uswap ARGS``: the ``uswap`` command that came with this package.

``python -m uswap run --limit 512MiB -- PROGRAM`` runs PROGRAM as ``uswap run`` does (see
the project's docs/cli.md); every other subcommand of ``uswap`` works the same way. The
command and its preload library lie in the package's ``_bin`` folder, where the build put
them; the command finds the library next to itself.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    exe = Path(__file__).resolve().parent / "_bin" / "uswap"
    if not os.access(exe, os.X_OK):
        sys.exit(
            f"python -m uswap: the uswap command is not in this package ({exe} is missing); "
            "reinstall the package from a wheel or with pip install from the source tree"
        )
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
