"""`kappa throttle`: change the share of the machine a running backfill gets, as a reindex's rethrottle.

`kappa throttle PIPELINE VERSION --share 0.3` fixes the share (the controller leaves it alone);
`--adaptive` hands it back to the controller, which starts from the share in force. Audited
(action ``throttle``), applied to the running job at once, shown in `kappa status` and the lag plot.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from orchestrator.cli.app import Actor, AsJson, Reason, app, cli_of, default_actor
from orchestrator.cli.render import print_json

__all__ = ["throttle_cmd"]


@app.command("throttle")
def throttle_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[int, typer.Argument(min=1, help="a running version that does not serve yet")],
    share: Annotated[Optional[float], typer.Option("--share", help="its share of the machine, in (0, 1]: fixed from now on")] = None,
    adaptive: Annotated[bool, typer.Option("--adaptive", help="let the controller decide again (the default mode)")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Set the share of a running backfill (--share 0.3, fixed) or give it back to the controller (--adaptive)."""
    from orchestrator.lifecycle.throttle import set_throttle

    cli = cli_of(ctx)
    v = cli.kappa().version(pipeline, version)
    result = set_throttle(v, actor=actor or default_actor(), share=share, adaptive=adaptive, reason=reason)
    if as_json:
        print_json(result)
    else:
        cli.out.print(result["message"], markup=False, highlight=False)
