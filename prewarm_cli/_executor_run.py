"""``prewarm executor run``: the node daemon (orders in, state out, load API, hand-off socket). Registered
on the executor sub-app from here so the executor CLI module stays its owner's; importing this module
adds the command."""

from __future__ import annotations

from pathlib import Path

import typer

from prewarm_cli._common import catalog_path, settings_of
from prewarm_cli._executor import app

__all__ = ["run"]


@app.command("run")
def run(
    ctx: typer.Context,
    node: str | None = typer.Option(None, "--node", help="Node name (default: PREWARM_NODE_NAME)."),
    catalog: Path | None = typer.Option(None, "--catalog", help="Catalog YAML (default: PREWARM_CATALOG)."),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="L2 directory (default: PREWARM_CACHE_DIR)."
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu, cuda or cuda:N (default: PREWARM_DEVICE)."
    ),
    state_interval: float = typer.Option(
        5.0, "--state-interval", min=0.1, help="Seconds between state reports."
    ),
    socket_dir: Path | None = typer.Option(
        None,
        "--socket-dir",
        help="Serve the hand-off socket for engines in this private directory (default: PREWARM_SOCKET_DIR; "
        "unset = no socket).",
    ),
    standalone: bool = typer.Option(
        False, "--standalone", help="No Kafka: only the load API and the hand-off socket."
    ),
) -> None:
    """Apply this node's orders, publish its state and serve POST /v1/load (and the hand-off socket)
    until interrupted."""
    from executor import Executor, ExecutorDaemon, run_forever
    from models import Catalog

    settings = settings_of(ctx)
    path = catalog_path(catalog, settings)
    ex = settings.executor if node is None else settings.executor.model_copy(update={"node_name": node})
    sockets = socket_dir or ex.socket_dir
    with Executor(Catalog.load(path), settings, executor=ex, cache_dir=cache_dir, device=device) as executor:
        daemon = ExecutorDaemon(
            executor,
            None if standalone else settings.kafka,
            state_interval_s=state_interval,
            catalog_path=path,
            socket_dir=sockets,
            api_token=ex.executor_api_token.get_secret_value() or None,
        )
        where = f"load API on http://{ex.executor_api_host}:{ex.executor_api_port}"
        if sockets is not None:
            where += f", hand-off socket in {sockets}"
        typer.echo(f"executor {ex.node_name}{' (standalone)' if standalone else ''}: {where}", err=True)
        run_forever(daemon, ex.executor_api_host, ex.executor_api_port)
