"""The KFP DAG (dag.py) and its compile and local-run entry points (run.py), packaged as mazerl.pipelines;
the components it wires are mazerl.components (the repository's components/).

Thin by rule: every component body calls one `mazerl.workflow` function. These two packages are the only
part of mazerl that imports kfp (install the `kfp` extra); the library never imports it.
"""
