"""The `mazerl` command line, one module per command group. Thin: every command parses its options and
calls one library function; `app` is the entry point (`mazerl`, `python -m mazerl`)."""

from .app import app
from .cluster import cluster_app
from .evaluate import eval_app
from .mazes import mazes_app
from .pipeline import pipeline_app
from .policy import policy_app
from .train import train_app

app.add_typer(mazes_app, name="mazes")
app.add_typer(policy_app, name="policy")
app.add_typer(train_app, name="train")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(eval_app, name="eval")
app.add_typer(cluster_app, name="cluster")


def main() -> None:  # pragma: no cover - console entry point
    app()
