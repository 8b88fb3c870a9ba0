"""`mazerl pipeline ...`: compile, run here (kfp.local), rehearse, and submit, schedule, list and disable on a KFP host."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import EXIT_FAILED
from .common import (console, err_console, _escape, _fail, _print_rows, _load_profile, _cluster_profile,
                     _pipeline_modules)


pipeline_app = typer.Typer(help="The KFP pipeline: compile, run locally (kfp.local), submit and schedule on a KFP host.",
                            no_args_is_help=True)


@pipeline_app.command("compile")
def pipeline_compile(
    profile: Annotated[str, typer.Option(help="profile name (env/<name>.yaml) or path")],
    out: Annotated[Path, typer.Option(help="pipeline spec to write (YAML)")],
) -> None:
    """Compile the DAG with the profile's images and cluster settings (deterministic output)."""
    from ..config import ConfigError

    prof = _load_profile(profile)
    try:
        path = _pipeline_modules().compile_pipeline(prof, out)
    except ConfigError as err:
        _fail(str(err))
    console.print(f"compiled {prof.name} -> {path}")


@pipeline_app.command("run")
def pipeline_run_cmd(
    profile: Annotated[str, typer.Option(help="a local profile (env/local.yaml)")] = "local",
    config: Annotated[str, typer.Option(help="smoke (minutes) | default (the profile's values)")] = "default",
    reference: Annotated[Optional[str], typer.Option(help="VisGym reference splits: visgym (shipped, default) | none | a recording's path")] = None,
    param: Annotated[Optional[list[str]], typer.Option("--param", help="pipeline parameter override: key=value")] = None,
    verbose: Annotated[bool, typer.Option(help="show kfp.local's whole output (always kept in the run's logs)")] = False,
) -> None:
    """Run the whole DAG here with kfp.local (SubprocessRunner, no Docker, no Kubernetes)."""
    import json

    from ..config import ConfigError, parse_overrides

    prof = _load_profile(profile)
    if prof.kind != "local":
        _fail(f"profile {prof.name!r} is a cluster profile: compile it, or submit it to its KFP host")
    runner = _pipeline_modules()
    if config not in runner.RUN_CONFIGS:
        _fail(f"unknown --config {config!r}: allowed {', '.join(runner.RUN_CONFIGS)}")
    if reference is not None:
        from ..workflow import resolve_reference

        resolve_reference(reference)  # a missing file: one message now, not a generate task failing and retrying
    run_settings = {**runner.RUN_CONFIGS[config], **({"reference": reference} if reference is not None else {})}
    try:
        overrides = runner.check_arguments(prof, parse_overrides(param or []), run_settings)
    except ConfigError as err:
        _fail(str(err))
    root = Path(prof.storage.root)
    arguments = {"registry_root": str(root / "registry"), **run_settings, **overrides}
    console.print(f"running the mazerl DAG locally (profile {prof.name}, config {config}); full logs under {root / 'runs'}",
                  soft_wrap=True, highlight=False)
    run = runner.run_local_logged(prof, root, arguments, verbose=verbose)
    if run.error is not None:
        _report_failure(run.error, run.run_dir, run.log, run.task_logs)
    run_dir = run.run_dir
    comparison = json.loads((run_dir / "compare" / "result" / "comparison.json").read_text())
    from ..evaluation.report import compare_tables, guard_tables

    _print_rows("trained vs baseline (greedy, paired on the same mazes)", compare_tables(comparison))
    if comparison.get("guards"):
        _print_rows("guards (each blocks the promotion if the trained model is significantly worse)", guard_tables(comparison))
    d = comparison["decision"]
    figures = (f"heldout {d['success_diff']:+.3f}, p = {d['p_value']:.3g}; "
               f"rule: gain > {d['min_gain']} and p <= {d['max_p_value']}"
               + (f"; blocked by {', '.join(d['blocked_by'])}" if d.get("blocked_by") else "")
               + (f"; undecided (too few mazes): {', '.join(d['undecided'])}" if d.get("undecided") else ""))
    try:  # what the promote step did (its registry entry), not only what compare decided
        promoted = runner.promotion_of_run(run_dir, arguments["registry_root"])
    except ConfigError as err:
        _fail(str(err))
    if promoted:
        console.print(f"promotion: yes ({figures})", highlight=False)
        console.print(f"promoted: {promoted['model']} (registry {Path(arguments['registry_root']) / 'promoted.json'}; "
                      "the next run starts from it)", soft_wrap=True, highlight=False)
    elif d["improved"]:
        err_console.print(f"[bold red]error:[/] compare decided to promote ({_escape(figures)}), but no promote step ran: "
                          f"nothing was promoted; see {run_dir / 'pipeline.log'}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=EXIT_FAILED)
    else:
        console.print(f"promotion: no ({figures})", highlight=False)
    console.print(f"report: {(run_dir / 'evaluate-2' / 'results' / 'report.html').resolve()}", soft_wrap=True)


@pipeline_app.command("rehearse")
def pipeline_rehearse_cmd(
    profile: Annotated[str, typer.Option(help="a cluster profile with a RayJob (hyperpod-p5, hyperpod-g5) or its path")],
    out: Annotated[Optional[Path], typer.Option(help="a new folder for everything the rehearsal writes "
                                                     "(default: outputs/rehearsal-<profile>-<time>)")] = None,
    cancel_after_step: Annotated[Optional[int], typer.Option(
        "--cancel-after-step", help="terminate the run (SIGTERM to the train task, as KFP does) once training wrote this step")] = None,
) -> None:
    """Rehearse a HyperPod run here: the profile's compiled DAG with kfp.local, its RayJob created in a local
    Kubernetes API and run on a local Ray with vLLM, S3 and SageMaker on moto, FSx a folder. Only the model
    (a tiny one with the real one's proportions), device, dtypes and counts change; rehearsal.json says what ran."""
    import json
    import time

    prof = _load_profile(profile)
    _pipeline_modules()
    from ..rehearsal.run import rehearse

    target = out or Path("outputs") / f"rehearsal-{prof.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    record = rehearse(prof, target, cancel_after_step, log=lambda line: console.print(line, soft_wrap=True, highlight=False))
    o = record["outcome"]
    console.print(f"engine {record['engine']}, placement {record['placement']['placement']}, history "
                  f"{json.dumps(record['history'])}, weight sync {record['weight_sync']['mode']}", highlight=False)
    console.print(f"steps trained: {o['steps_trained']}; compared: {o['compared']}; decision: {o['decision']}; "
                  f"registered: {o['registered']}; RayJobs left running: {o['rayjobs_left']}; "
                  f"processes left: {len(o['processes_left'])}", highlight=False)
    console.print(f"rehearsal: {(Path(target) / 'rehearsal.json').resolve()}", soft_wrap=True, highlight=False)
    expected_end = o["terminated_after_step"] is not None if cancel_after_step is not None else o["compared"]
    if not expected_end or o["rayjobs_left"] or o["processes_left"] or record["rayjob_schema_errors"]:
        err_console.print("[bold red]error:[/] the rehearsal did not end as a shipped run must"
                          + (f" ({_escape(o['pipeline_error'])})" if o["pipeline_error"] else "")
                          + f"; see {_escape(record['logs']['pipeline'])}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=EXIT_FAILED)


HostOpt = Annotated[Optional[str], typer.Option("--host", help="KFP API URL (default: the profile's kfp_host)")]


AuthOpt = Annotated[str, typer.Option("--auth", help="none | token (--token-file or $MAZERL_KFP_TOKEN) | kube (kubeconfig context)")]


TokenFileOpt = Annotated[Optional[Path], typer.Option("--token-file", help="file holding the bearer token (--auth token)")]


KubeContextOpt = Annotated[Optional[str], typer.Option("--kube-context", help="kubeconfig context (--auth kube; default: current)")]


KfpNamespaceOpt = Annotated[str, typer.Option("--kfp-namespace", help="namespace of the ml-pipeline service (--auth kube)")]


ExperimentOpt = Annotated[str, typer.Option("--experiment", help="KFP experiment (created if missing)")]


ParamOpt = Annotated[Optional[list[str]], typer.Option("--param", help="pipeline parameter: key=value (repeatable)")]


def _connection(prof, host, auth, token_file, kube_context, kfp_namespace):
    from ..kfp_remote import Connection, KFPError, read_token, timeout_from_env

    try:
        token = read_token(token_file) if auth == "token" else None
        timeout_s = timeout_from_env()
    except KFPError as err:
        _fail(str(err))
    return Connection(host=host or (prof.kfp_host if prof else None), auth=auth, token=token,
                      kube_context=kube_context, kfp_namespace=kfp_namespace, timeout_s=timeout_s)


def _prepare_remote(prof, conn, experiment: str, param: list[str] | None, package_dir: Path):
    """Compile for the profile, then the library's preparation (parameters, upload, experiment)."""
    from ..config import ConfigError, parse_overrides
    from ..kfp_remote import KFPError, prepare

    try:
        package = _pipeline_modules().compile_pipeline(prof, package_dir / "pipeline.yaml")
        session, target, params = prepare(
            conn, package, parse_overrides(param or []), experiment, namespace=prof.namespace,
            pipeline_root=prof.pipeline_root, service_account=prof.service_account, description=f"mazerl, profile {prof.name}",
        )
    except (ConfigError, KFPError) as err:
        _fail(str(err))
    console.print(f"pipeline {target.pipeline_id} version {target.version_id} "
                  f"({'uploaded' if target.uploaded else 'unchanged, reused'}); experiment {experiment!r} {target.experiment_id}",
                  soft_wrap=True)
    return session, target, params


def _print_ui_link(conn, kind: str, ident: str) -> None:
    from ..kfp_remote import ui_link

    link = ui_link(conn, kind, ident)
    if link:
        console.print(f"ui: {link}", soft_wrap=True)


@pipeline_app.command("submit")
def pipeline_submit(
    profile: Annotated[str, typer.Option(help="cluster profile name (env/<name>.yaml) or path")],
    host: HostOpt = None,
    experiment: ExperimentOpt = "mazerl",
    param: ParamOpt = None,
    run_name: Annotated[Optional[str], typer.Option(help="run name (default: mazerl-<profile>-<UTC time>)")] = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Upload the pipeline (a new version only when it changed) and start one run on the KFP host."""
    import tempfile
    from datetime import datetime, timezone

    from ..kfp_remote import KFPError, start_run

    prof = _cluster_profile(profile, runnable=True)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    name = run_name or f"mazerl-{prof.name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    with tempfile.TemporaryDirectory() as tmp:
        session, target, params = _prepare_remote(prof, conn, experiment, param, Path(tmp))
        try:
            run_id = start_run(session, target, name, params)
        except KFPError as err:
            _fail(str(err))
    console.print(f"run {name!r} started: {run_id}")
    _print_ui_link(conn, "runs", run_id)


@pipeline_app.command("schedule")
def pipeline_schedule(
    profile: Annotated[str, typer.Option(help="cluster profile name (env/<name>.yaml) or path")],
    cron: Annotated[Optional[str], typer.Option(help="6-field cron, seconds first: '0 0 3 * * *' = 03:00 daily")] = None,
    every: Annotated[Optional[str], typer.Option(help="interval instead of cron: 90m, 24h, 7d (from 1m to 366d)")] = None,
    name: Annotated[Optional[str], typer.Option(help="recurring run name (default: mazerl-<profile>-retrain)")] = None,
    host: HostOpt = None,
    experiment: ExperimentOpt = "mazerl",
    param: ParamOpt = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Recurring retraining: one run at a time, no catch-up of missed runs; each run trains on fresh mazes."""
    import tempfile

    from ..kfp_remote import KFPError, create_schedule, parse_schedule

    prof = _cluster_profile(profile, runnable=True)
    try:
        schedule = parse_schedule(cron, every)
    except KFPError as err:
        _fail(str(err))
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    name = name or f"mazerl-{prof.name}-retrain"
    with tempfile.TemporaryDirectory() as tmp:
        session, target, params = _prepare_remote(prof, conn, experiment, param, Path(tmp))
        if params.get("train_seed", -1) >= 0:
            err_console.print("[yellow]notice:[/] a fixed train_seed makes every scheduled run train on the same mazes")
        try:
            recurring_id = create_schedule(session, target, name, schedule, params)
        except KFPError as err:
            _fail(str(err))
    when = schedule.get("cron_expression") or f"every {schedule['interval_second']} s"
    console.print(f"recurring run {name!r} created: {recurring_id} ({when}; max concurrency 1, no catch-up)")
    _print_ui_link(conn, "recurringrun", recurring_id)


@pipeline_app.command("list")
def pipeline_list(
    profile: Annotated[str, typer.Option(help="cluster profile (its kfp_host and namespace)")],
    host: HostOpt = None,
    experiment: Annotated[Optional[str], typer.Option(help="only this experiment's recurring runs")] = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """List the recurring runs (id, name, schedule, enabled)."""
    from ..kfp_remote import KFPError, connect, find_experiment, list_schedules

    prof = _cluster_profile(profile)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    try:
        session = connect(conn)
        namespace = session.namespace(prof.namespace)
        experiment_id = None
        if experiment is not None:
            experiment_id = find_experiment(session, experiment, namespace)
            if experiment_id is None:
                _fail(f"no experiment named {experiment!r} on {conn.where()}")
        rows = list_schedules(session, namespace, experiment_id)
    except KFPError as err:
        _fail(str(err))
    if not rows:
        console.print("no recurring runs")
        return
    # one line per recurring run, never wrapped, so it can be read by eye and by scripts alike
    lines = [("id", "name", "schedule", "enabled", "created")] + [
        (r.id, r.name, r.trigger, "yes" if r.enabled else "no", r.created) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    for line in lines:
        console.print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip(), soft_wrap=True, highlight=False, markup=False)


@pipeline_app.command("disable")
def pipeline_disable(
    recurring_run_id: Annotated[str, typer.Argument(help="id shown by `mazerl pipeline list`")],
    profile: Annotated[str, typer.Option(help="cluster profile (its kfp_host)")],
    host: HostOpt = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Stop a recurring run from starting new runs (it stays listed; runs in flight finish)."""
    from ..kfp_remote import KFPError, connect, disable_schedule

    prof = _cluster_profile(profile)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    try:
        disable_schedule(connect(conn), recurring_run_id)
    except KFPError as err:
        _fail(str(err))
    console.print(f"recurring run {recurring_run_id} disabled")


@pipeline_app.command("rbac")
def pipeline_rbac(
    profile: Annotated[str, typer.Option(help="cluster profile (its namespace and service account)")],
    iam_role_arn: Annotated[Optional[str], typer.Option(help="IAM role for the service account (IRSA: S3, SageMaker)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write here instead of standard output")] = None,
) -> None:
    """ServiceAccount, Role and RoleBinding that let the pipeline's pods run RayJobs: `kubectl apply -f`."""
    from ..atomic import write_text
    from ..cluster_rbac import rbac_manifests, render

    prof = _cluster_profile(profile)
    text = render(rbac_manifests(prof, iam_role_arn))
    if out is None:
        sys.stdout.write(text)
        return
    write_text(out, text)
    err_console.print(f"wrote {out}: kubectl apply -f {out}")


def _report_failure(error: RuntimeError, run_dir: Path | None, log: Path, task_logs: dict[str, Path]) -> None:
    """Which task failed, the end of its log, where the full log is, and what the other tasks left."""
    from ..task_logs import failed_task, tail, task_error

    task = failed_task(str(error))
    lines = [f"the pipeline failed: task {task!r} did not finish" if task else f"the pipeline failed: {error}"]
    if task and task in task_logs and (cause := task_error(task_logs[task])):
        lines.insert(1, f"its error: {cause}")
    if task and task in task_logs:
        console.print(f"[bold]last lines of {task}:[/]", highlight=False)
        console.print(tail(task_logs[task]), markup=False, highlight=False, soft_wrap=True)
        lines.append(f"its log: {task_logs[task]}")
    lines.append(f"whole run log: {log}")
    done = sorted(t for t in task_logs if t != task)
    if run_dir is not None:
        lines.append(f"outputs of the tasks that ran ({', '.join(done) or 'none'}): {run_dir}")
    _fail("\n".join(lines))
