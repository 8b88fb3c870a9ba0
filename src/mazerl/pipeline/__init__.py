"""The KFP adapter: components (one module per stage), the DAG, and compile / local-run entry points.

Thin by rule: every component body calls one `mazerl.workflow` function. This package is the only
part of mazerl that imports kfp (install the `kfp` extra); the library never imports it.
"""
