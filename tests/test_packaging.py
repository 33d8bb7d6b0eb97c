"""pip (pyproject.toml) and conda (environment.yml) describe the same dependencies."""

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[1]


def split(req: str) -> tuple[str, str]:
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", req).groups()
    return name.lower().replace("_", "-"), spec.replace(" ", "")


@pytest.fixture(scope="module")
def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.fixture(scope="module")
def env():
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_and_pip(env):
    conda, pip = {}, {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if not line.startswith("-e"):
                    pip.update([split(line)])
        elif not dep.startswith(("python", "pip")):
            conda.update([split(dep.replace("=", "==", 1) if re.match(r"^[^<>=!]+=[^=]", dep) else dep)])
    return conda, pip


def test_environment_installs_the_package_with_the_extras_of_a_lab(env, project):
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    editable = [line for line in pip_lines if line.startswith("-e")]
    assert len(editable) == 1
    extras = set(re.search(r"\[(.*)\]", editable[0]).group(1).split(","))
    assert extras == {"lab", "dev"} and extras <= set(project["optional-dependencies"])
    assert "conda-forge" in env["channels"]


def test_every_pip_dependency_is_in_the_conda_environment_with_the_same_bound(env, project):
    wanted = dict(split(r) for r in project["dependencies"])
    for extra in ("lab", "dev"):
        wanted.update(split(r) for r in project["optional-dependencies"][extra])
    conda, pip = conda_and_pip(env)
    described = {**conda, **pip}
    assert set(described) == set(wanted), set(described) ^ set(wanted)
    for name, spec in wanted.items():
        assert described[name] == spec, (name, described[name], spec)


def test_python_version_agrees(env, project):
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    major, minor = map(int, py.split("=")[1].split(".")[:2])
    low = re.match(r">=(\d+)\.(\d+)", project["requires-python"]).groups()
    assert (major, minor) >= tuple(map(int, low))


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
