"""The KFP pipeline: profiles, compile (with the cluster settings) and a whole local run."""

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.config import ConfigError
from mazerl.profiles import PROFILE_DIR, available_profiles, load_profile

runner = CliRunner()


def test_every_shipped_profile_loads():
    assert {"local", "hyperpod-p5", "hyperpod-g5"} <= set(available_profiles())
    for name in available_profiles():
        load_profile(name)


def test_bad_profiles_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="unknown profile 'nope': available"):
        load_profile("nope")
    raw = yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())
    del raw["namespace"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="namespace"):
        load_profile(str(tmp_path / "p.yaml"))
    raw = yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())
    raw["images"]["runtime"] = "mazerl-runtime:latest"
    (tmp_path / "u.yaml").write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["pipeline", "compile", "--profile", str(tmp_path / "u.yaml"), "--out", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2 and "not pinned" in result.output
    raw["colour"] = "blue"
    (tmp_path / "k.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="colour"):
        load_profile(str(tmp_path / "k.yaml"))


def test_compile_is_deterministic_and_carries_the_cluster_settings(tmp_path):
    from kfp.components import load_component_from_file

    for name in ("a", "b"):
        result = runner.invoke(app, ["pipeline", "compile", "--profile", "hyperpod-p5", "--out", str(tmp_path / f"{name}.yaml")])
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a.yaml").read_bytes() == (tmp_path / "b.yaml").read_bytes()
    pipeline = load_component_from_file(str(tmp_path / "a.yaml"))
    assert pipeline.name == "mazerl"
    docs = list(yaml.safe_load_all((tmp_path / "a.yaml").read_text()))
    spec, platform = docs[0], docs[1]
    assert {"generate-mazes", "train-grpo", "evaluate", "evaluate-2", "compare", "promote"} <= set(
        re.sub(r"^exec-", "", k) for k in spec["deploymentSpec"]["executors"]
    )
    profile = load_profile("hyperpod-p5")
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    evaluate = executors["exec-evaluate"]
    assert evaluate["pvcMount"][0]["constant"] == "fsx-claim" and evaluate["pvcMount"][0]["mountPath"] == "/fsx"
    assert evaluate["nodeSelector"]["labels"] == profile.node_selector
    assert evaluate["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert evaluate["podMetadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-ml-research-localqueue"
    # backend rayjob: the train step is a CPU pod driving the RayJob: FSx, but no GPU node and no Kueue workload
    train = executors["exec-train-grpo"]
    assert train["pvcMount"][0]["constant"] == "fsx-claim"
    assert "nodeSelector" not in train and "podMetadata" not in train
    images = {k: e["container"]["image"] for k, e in spec["deploymentSpec"]["executors"].items()}
    # eval_engine vllm: the evaluate tasks run in the trainer image (vLLM); every other task in the runtime image
    assert {k for k, image in images.items() if image == profile.images.trainer} == {"exec-evaluate", "exec-evaluate-2"}
    assert {image for k, image in images.items() if not k.startswith("exec-evaluate")} == {profile.images.runtime}
    # the branch is on a number, never a string (kfp.local evaluates string conditions with eval)
    dag = spec["root"]["dag"]["tasks"]["exit-handler-1"]
    inner = spec["components"][dag["componentRef"]["name"]]["dag"]["tasks"]
    conditions = [t["triggerPolicy"]["condition"] for t in inner.values() if "triggerPolicy" in t]
    # ... on compare's return value: kfp.local resolves `<task>-Output`, and skips a branch on a NamedTuple field
    assert conditions == ["int(inputs.parameter_values['pipelinechannel--compare-Output']) == 1"]


def test_local_run_of_the_whole_dag(tmp_path, monkeypatch):
    raw = yaml.safe_load((PROFILE_DIR / "local.yaml").read_text())
    raw["storage"]["root"] = str(tmp_path / "store")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)  # named configs and the shipped reference: nothing is read relative to the checkout
    result = runner.invoke(app, ["pipeline", "run", "--profile", str(tmp_path / "local.yaml"), "--config", "smoke"])
    assert result.exit_code == 0, result.output[-3000:]
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("report: ") and last.endswith("report.html")
    report = Path(last.removeprefix("report: "))
    summary = json.loads((report.parent / "summary.json").read_text())
    assert summary["splits"]["heldout"]["greedy"]["episodes"] == 16
    # the shipped VisGym reference splits are evaluated by default (smoke: reference_mazes = 4)
    assert summary["splits"]["visgym-easy-64"]["greedy"]["episodes"] == 4
    assert summary["splits"]["visgym-hard-64"]["greedy"]["episodes"] == 4
    comparison = json.loads((report.parents[2] / "compare" / "result" / "comparison.json").read_text())
    decision = comparison["decision"]
    verdict = "yes" if decision["improved"] else "no"
    assert f"promotion: {verdict} (heldout {decision['success_diff']:+.3f}" in result.output
    assert decision["improved"] == (decision["success_diff"] > decision["min_gain"] and decision["p_value"] <= decision["max_p_value"])
    # the verdict is what the promote step did: it ran exactly when compare decided to promote
    assert (report.parents[2] / "promote" / "executor_output.json").is_file() == decision["improved"]
    assert ("promoted: " in result.output) == decision["improved"]
    assert "trained vs baseline" in result.output
    # the console is readable: task boundaries and progress lines, no executor JSON
    assert "> train-grpo" in result.output and "ok: train-grpo" in result.output
    assert "train-grpo  step " in result.output and "evaluate-trained  mazes " in result.output
    assert '"parameterValues"' not in result.output and "executor_input" not in result.output
    run_dir = report.parents[2]
    assert (run_dir / "pipeline.log").is_file()
    assert '"parameterValues"' in (run_dir / "pipeline.log").read_text()  # ... it is all in the logs
    for task in ("generate-mazes", "resolve-model", "train-grpo", "evaluate-2", "compare"):
        assert "Executing task" in (run_dir / task / "task.log").read_text()
    refused = runner.invoke(app, ["pipeline", "run", "--profile", "hyperpod-p5"])
    assert refused.exit_code == 2 and "cluster profile" in refused.output


def test_local_run_checks_parameters_before_running(tmp_path):
    unknown = runner.invoke(app, ["pipeline", "run", "--param", "grpo_stpes=2"])
    assert unknown.exit_code == 2 and "grpo_stpes" in unknown.output and "grpo_steps" in unknown.output
    wrong = runner.invoke(app, ["pipeline", "run", "--param", "heldout_mazes=many"])
    assert wrong.exit_code == 2 and "heldout_mazes = 'many' is not an integer" in wrong.output


def test_a_failed_task_names_itself_and_its_log_and_keeps_the_other_outputs(tmp_path):
    raw = yaml.safe_load((PROFILE_DIR / "local.yaml").read_text())
    raw["storage"]["root"] = str(tmp_path / "store")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(raw))
    missing = tmp_path / "no-such-sft.yaml"
    result = runner.invoke(app, ["pipeline", "run", "--profile", str(tmp_path / "local.yaml"), "--config", "smoke",
                                 "--param", "warm_start=true", "--param", f"sft_config={missing}"])
    assert result.exit_code == 2, result.output[-3000:]
    assert "task 'warm-start' did not finish" in result.output
    # the console shows the task's own error, not only kfp's "finished with status FAILURE"
    assert f"its error: ConfigError: config file not found: {missing}" in result.output
    log_line = next(line for line in result.output.splitlines() if line.startswith("its log: "))
    task_log = Path(log_line.removeprefix("its log: "))
    assert task_log.name == "task.log" and task_log.parent.name == "warm-start"
    assert str(missing) in task_log.read_text()  # the task's own error is in its log
    run_dir = task_log.parents[1]
    assert (run_dir / "pipeline.log").is_file()
    generated = next((run_dir / "generate-mazes").rglob("manifest.json"))  # upstream outputs are kept
    assert json.loads(generated.read_text())["splits"]
    assert "generate-mazes" in result.output and str(run_dir) in result.output
    assert not (run_dir / "train-grpo").exists()  # nothing downstream of the failure ran


def test_training_backend_seam_refuses_what_it_does_not_have(tmp_path):
    from mazerl.workflow import TRAINING_BACKENDS, check_backend, cleanup_launched, train_grpo

    assert TRAINING_BACKENDS == ("local", "ray", "rayjob")
    check_backend("local")
    assert "nothing" in cleanup_launched("local") and "backend ray" in cleanup_launched("ray")
    with pytest.raises(ConfigError, match=r"'slurm' is not available .*available: local, ray, rayjob"):
        train_grpo("tiny", str(tmp_path), "tiny-grpo", str(tmp_path / "out"), backend="slurm")
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_ray_backend_of_a_profile_reaches_the_ray_driver(monkeypatch, small_mazes, tmp_path):
    """backend: ray routes train_grpo to the Ray driver with distributed.backend set (the driver
    itself is tested for real in test_ray_backend.py)."""
    import mazerl.distributed.ray_grpo as ray_grpo
    from mazerl.workflow import train_grpo

    seen = {}

    class FakeDriver:  # records what it was given; stands in for starting a Ray cluster here
        def __init__(self, cfg, on_step=None):
            seen["cfg"] = cfg

        def run(self, resume, overwrite=False):
            seen["resume"], seen["overwrite"] = resume, overwrite
            return {"step": 0}

    monkeypatch.setattr(ray_grpo, "RayGRPO", FakeDriver)
    final, record = train_grpo("tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "out"), backend="ray")
    # as in process: a retried task resumes from its checkpoint, or starts over in its own output folder
    assert seen["cfg"].distributed.backend == "ray" and seen["resume"] == "auto" and seen["overwrite"] is True
    assert seen["cfg"].train_data == str(small_mazes / "train.parquet") and final.endswith("final")


def test_evaluation_plays_the_reference_splits_in_full(tmp_path):
    from mazerl.workflow import evaluation_limits

    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"reference_splits": {"visgym-easy-64": "maze_2d/easy"}}}))
    splits = ["heldout", "larger", "visgym-easy-64"]
    assert evaluation_limits(str(tmp_path), splits, 500, 24) == {"heldout": 500, "larger": 24}
    assert evaluation_limits(str(tmp_path), splits, 16, 4, reference=4) == {"heldout": 16, "larger": 4, "visgym-easy-64": 4}


def test_workflow_refuses_silent_fallbacks(tmp_path):
    from mazerl.mazes.layout import MazeError
    from mazerl.workflow import REGISTRY_FILE, resolve_base_model, resolve_reference

    with pytest.raises(MazeError, match="reference file not found: .*nope.json"):
        resolve_reference(str(tmp_path / "nope.json"))
    assert resolve_reference("none") is None and resolve_reference("") is None
    assert Path(resolve_reference("visgym")).is_file()
    (tmp_path / REGISTRY_FILE).write_text(json.dumps({"model": str(tmp_path / "gone"), "run_id": "r1"}))
    with pytest.raises(ConfigError, match="no longer exists"):
        resolve_base_model("tiny-base", str(tmp_path / "out"), str(tmp_path))


def test_named_configs_and_profiles_work_from_any_directory(tmp_path, monkeypatch):
    from mazerl.config import resolve_job_config

    monkeypatch.chdir(tmp_path)
    assert Path(resolve_job_config("tiny-grpo")).is_file()
    with pytest.raises(ConfigError, match="unknown config 'tiny-grpp'.*tiny-grpo"):
        resolve_job_config("tiny-grpp")
    result = runner.invoke(app, ["pipeline", "compile", "--profile", "local", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0, result.output
    assert "tiny-base" in (tmp_path / "p.yaml").read_text()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[1]
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(root)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    return next(out.glob("mazerl-*.whl"))


def test_the_wheel_carries_configs_profiles_reference_model_and_dag(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("mazerl/configs/jobs/tiny-grpo.yaml", "mazerl/configs/profiles/local.yaml",
                   "mazerl/data/visgym_maze2d_reference.json", "mazerl/assets/tiny-base/model.safetensors",
                   "mazerl/assets/tiny-base/provenance.json", "mazerl/pipelines/dag.py",
                   "mazerl/pipelines/run.py", "mazerl/components/train_grpo.py", "mazerl/components/__init__.py",
                   "mazerl/cli/__init__.py", "mazerl/integrations/skyrl.py"):
        assert needed in names, needed
    assert not any(n.startswith(("components/", "pipelines/")) for n in names)  # no top-level packages of those names


def test_a_pip_installed_mazerl_runs_its_pipeline_promotes_and_the_next_run_starts_from_it(wheel, tmp_path):
    """As a user meets it: the wheel in a fresh venv (whose site-packages path holds `python3.11`, the
    string kfp.local's runner rewrites), the smoke DAG run twice from a directory outside the checkout.
    The first run's decision is to promote (the rule is opened: gain > -1, p <= 1), so its promote step
    must run and leave the registry pointing at the new model; the second run must start from it."""
    import site
    import subprocess
    import sys

    venv = tmp_path / "python3.11-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                           text=True).strip())
    assert "python3.11" in str(purelib)
    # the dependencies come from the test's own environment (a .pth line: not a site dir, so its editable mazerl stays out)
    (purelib / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    where = subprocess.check_output([str(python), "-c", "import mazerl; print(mazerl.__file__)"], text=True, cwd=tmp_path)
    assert where.startswith(str(purelib)), where  # the wheel's mazerl, not the checkout's

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    def pipeline_run() -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "mazerl"), "pipeline", "run", "--config", "smoke", "--param", "min_gain=-1",
                               "--param", "max_p_value=1"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=1500)

    # the top-level components/ and pipelines/ travel in the wheel as mazerl.components and mazerl.pipelines
    for profile in ("local", "hyperpod-p5"):
        compiled = subprocess.run([str(venv / "bin" / "mazerl"), "pipeline", "compile", "--profile", profile, "--out",
                                   f"{profile}.yaml"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=600)
        assert compiled.returncode == 0, compiled.stdout[-3000:] + compiled.stderr[-3000:]
        assert "train-grpo" in (elsewhere / f"{profile}.yaml").read_text()

    first = pipeline_run()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    registry = elsewhere / "outputs" / "pipeline" / "registry" / "promoted.json"
    entry = json.loads(registry.read_text())
    assert Path(entry["model"]).is_dir() and str(elsewhere) in entry["model"]
    assert f"promoted: {entry['model']}" in first.stdout and "promotion: yes" in first.stdout
    runs = sorted((elsewhere / "outputs" / "pipeline" / "runs").glob("mazerl-*"))
    assert (runs[-1] / "promote" / "executor_output.json").is_file()
    # the shipped tiny-base's path inside site-packages reached every task intact
    assert "tiny-base" in (runs[-1] / "resolve-model" / "executor_output.json").read_text()
    assert "Could not resolve" not in (runs[-1] / "pipeline.log").read_text()

    second = pipeline_run()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    runs = sorted((elsewhere / "outputs" / "pipeline" / "runs").glob("mazerl-*"))
    resolved = json.loads((runs[-1] / "resolve-model" / "executor_output.json").read_text())["parameterValues"]["Output"]
    assert resolved == entry["model"]  # retraining compounds: the second run starts from the first's promoted model
    history = json.loads(registry.read_text())["history"]
    assert history[0]["model"] == entry["model"]


def test_kfp_local_passes_parameter_values_that_contain_python3_intact(tmp_path):
    """kfp.local's SubprocessRunner rewrites `python3` in every argument of a task, data included."""
    from kfp import dsl, local

    from mazerl.pipelines.run import _values_passed_intact

    @dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
    def echo(text: str) -> str:
        return text

    value = str(tmp_path / "v" / "lib" / "python3.11" / "site-packages" / "mazerl")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    with _values_passed_intact():
        assert echo(text=value).output == value


def test_a_decision_to_promote_that_no_promote_step_carried_out_is_a_failure(tmp_path, monkeypatch):
    """The console's verdict comes from the promote step's output and the registry, never from
    compare's decision alone (kfp.local once skipped the promote branch silently)."""
    import mazerl.pipelines.run as pipeline_run
    from mazerl.pipelines.run import LocalRun, promotion_of_run

    run_dir = tmp_path / "runs" / "mazerl-1"
    (run_dir / "compare" / "result").mkdir(parents=True)
    decision = {"split": "heldout", "success_diff": 0.2, "p_value": 1e-6, "min_gain": 0.0, "max_p_value": 0.05, "improved": True}
    (run_dir / "compare" / "result" / "comparison.json").write_text(json.dumps({"splits": {}, "decision": decision}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline_run, "run_local_logged", lambda *a, **k: LocalRun(run_dir, run_dir / "pipeline.log"))
    monkeypatch.setattr(pipeline_run, "check_arguments", lambda profile, arguments, run_settings=None: arguments)
    monkeypatch.setattr("mazerl.evaluation.report.compare_tables", lambda comparison: [["split"]])
    result = runner.invoke(app, ["pipeline", "run", "--config", "smoke"])
    assert result.exit_code == 1, result.output
    assert "no promote step ran: nothing was promoted" in " ".join(result.output.split())
    assert "promotion: yes" not in result.output

    # the promote step ran, but the registry names another model: refused, not reported as promoted
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "promoted.json").write_text(json.dumps({"model": "/elsewhere", "run_id": "r0"}))
    (run_dir / "promote").mkdir()
    (run_dir / "promote" / "executor_output.json").write_text(json.dumps({"parameterValues": {"Output": str(registry / "m")}}))
    with pytest.raises(ConfigError, match="points at /elsewhere"):
        promotion_of_run(run_dir, str(registry))
    (registry / "promoted.json").write_text(json.dumps({"model": str(registry / "m"), "run_id": "r1"}))
    assert promotion_of_run(run_dir, str(registry))["run_id"] == "r1"


def test_kfp_locals_expected_warning_goes_to_the_log_and_others_stay_on_the_console(capsys):
    """The demo's console showed kfp.local's `Could not resolve parent input: compare-improved` after a correct run:
    during a local run it goes to standard output (the run's log; the console filter hides it), while any other
    warning still reaches standard error."""
    import logging
    import sys

    from mazerl.pipelines.run import expected_kfp_warnings_to_log

    handler = logging.StreamHandler(sys.stderr)  # capsys's stderr, as logging.basicConfig's handler writes
    logging.getLogger().addHandler(handler)
    try:
        with expected_kfp_warnings_to_log():
            logging.warning("Could not resolve parent input: compare-improved")
            logging.warning("Could not resolve task output: train-grpo.Output")
        logging.warning("Could not resolve parent input: after the run")
    finally:
        logging.getLogger().removeHandler(handler)
    out, err = capsys.readouterr()
    assert "Could not resolve parent input: compare-improved (expected" in out
    assert "compare-improved" not in err
    assert "Could not resolve task output: train-grpo.Output" in err  # not an expected one: kept
    assert "after the run" in err  # the filter is gone once the run is over
