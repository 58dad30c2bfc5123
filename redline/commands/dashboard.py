"""`redline dashboard DIR`: serve a run's or a sweep's dashboard on localhost; it refreshes while the sweep runs.

    redline dashboard sweeps/ablations              # http://127.0.0.1:8765/
    redline dashboard sweeps/ablations --port 0     # any free port

The page is the same self-contained dashboard.html that `redline report` writes; served, it polls
/data.json every few seconds and redraws. Stop with Ctrl-C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import tyro

DESCRIPTION = "Serve a run or sweep directory's dashboard on localhost, refreshing while a sweep is running."


@dataclass
class DashboardArgs:
    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="DIR")]
    """A sweep directory, a run directory, or a folder of run directories."""
    port: int = 8765
    """Port to listen on (0: any free port)."""
    host: str = "127.0.0.1"
    """Address to listen on; the default serves this machine only."""


def main(argv: list[str]) -> int:
    from redline.errors import UserError
    from redline.experiments.dashboard import make_server

    args = tyro.cli(DashboardArgs, args=argv, prog="redline dashboard", description=DESCRIPTION)
    from pathlib import Path

    if not Path(args.path).is_dir():
        raise UserError(f"{args.path} is not a folder; give a sweep directory, a run directory or a folder of runs")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be 0-65535 (0: any free port), got {args.port}")
    try:
        server = make_server(args.path, args.host, args.port)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); choose another --port") from None
    host, port = server.server_address[:2]
    print(f"redline dashboard: serving {args.path} on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
