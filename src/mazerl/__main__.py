"""`python -m mazerl ...`: the same CLI as the `mazerl` command (the RayJob entrypoint uses this form)."""

from mazerl.cli import app

if __name__ == "__main__":  # spawned workers (vLLM's engine process) re-import this module: run once
    app(prog_name="mazerl")
