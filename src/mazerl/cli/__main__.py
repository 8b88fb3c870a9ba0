"""`python -m mazerl.cli ...`: the same CLI as the `mazerl` command."""

from . import app

if __name__ == "__main__":  # pragma: no cover
    app()
