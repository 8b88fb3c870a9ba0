"""The mazerl DAG and its compile / local-run entry points."""
