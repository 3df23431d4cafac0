"""The `versus-collector` console script: catch stop signals first, then load the collector.

`supervise` is what a service manager starts and stops: a stop while its modules are still being
imported (a second or more on a loaded host) ends it at once with status 0 instead of killing it
(-15); once loaded, the supervisor's own handlers take over (collector/supervisor/loop.py).
"""

from __future__ import annotations

import sys

from common.runtime import early_signals


def main() -> int:
    if sys.argv[1:2] == ["supervise"]:
        early_signals.install(importing=True)
    from collector.main import main as collector_main

    return collector_main()
