"""The command groups. Add a group by importing its Typer app and adding it here."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from cellsight.cli.notifications_cmd import app as notifications_app

    app.add_typer(notifications_app, name="notifications")
    from cellsight.cli.cells_cmd import app as cells_app
    from cellsight.cli.ops_cmd import app as ops_app

    app.add_typer(cells_app, name="cells")
    app.add_typer(ops_app, name="ops")
    from cellsight.cli.indexer_cmd import dlq_app, index_app, run_indexer

    app.command("indexer")(run_indexer)
    app.add_typer(dlq_app, name="dlq")
    app.add_typer(index_app, name="index")
    from cellsight.cli.api_cmd import serve

    app.command("api")(serve)
    from cellsight.cli.demo_cmd import demo

    app.command("demo")(demo)
