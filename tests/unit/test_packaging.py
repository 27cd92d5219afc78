"""The promises around the code: dependencies in step, README commands that CI really runs."""

import importlib.util
import re
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from commhooks_lab.course import install_paths

ROOT = Path(__file__).resolve().parents[2]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_every_runtime_dependency_is_in_environment_yml():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {_name(d) for d in env["dependencies"] if isinstance(d, str)}
    missing = [n for n in map(_name, project["dependencies"]) if CONDA_NAMES.get(n, n) not in conda]
    assert not missing, f"add to environment.yml: {missing}"


def locks() -> dict[tuple[int, int], dict[str, str]]:
    """Each supported Python's lock, ``{name: line}``, as scripts/setup_venv.py picks them."""
    return {
        version: {
            _name(line): line
            for line in (ROOT / install_paths.lock_for(version)).read_text().splitlines()
            if line and not line.startswith("#")
        }
        for version in install_paths.SUPPORTED_PYTHONS
    }


@pytest.mark.parametrize("version", install_paths.SUPPORTED_PYTHONS)
def test_each_lock_pins_every_runtime_dependency_exactly(version):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locks()[version]
    for requirement in project["dependencies"]:
        name = _name(requirement)
        assert "==" in pins.get(name, ""), f"{install_paths.lock_for(version)} must pin {name} exactly"
        pinned = pins[name].split("==")[1]
        assert Requirement(requirement).specifier.contains(pinned), f"pyproject.toml excludes {pins[name]}"
    assert pins["torch"] == "torch==2.13.0"


def test_requires_python_admits_exactly_the_pythons_with_a_lock():
    allowed = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    admitted = {(3, minor) for minor in range(6, 20) if f"3.{minor}.0" in allowed}
    assert admitted == set(install_paths.SUPPORTED_PYTHONS)


def test_the_torch_range_is_the_tested_torches():
    """2.13.0 (CPU build, every lock) and 2.14.1 (CUDA build) are the torches the suite and notebooks ran on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = next(Requirement(r) for r in project["dependencies"] if _name(r) == "torch")
    assert [v for v in ("2.12.1", "2.13.0", "2.14.1", "2.15.0") if torch.specifier.contains(v)] == ["2.13.0", "2.14.1"]


def test_environment_yml_is_the_main_lock_on_conda():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    main = install_paths.MAIN_PYTHON
    assert f"python={main[0]}.{main[1]}" in env["dependencies"]
    torch = locks()[main]["torch"].split("==")[1]
    assert f"pytorch={torch} *cpu*" in env["dependencies"]


def readme_commands() -> dict[str, str]:
    """The README's command blocks, keyed by the marker comment above each: what the site's lessons show too."""
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
    build_site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_site)
    return build_site.readme_commands()


def test_ci_runs_the_readme_commands_verbatim():
    commands = readme_commands()
    assert set(commands) == {"setup", "test"}
    ci = (ROOT / ".ci" / "run").read_text()
    for name, command in commands.items():
        assert command.strip() in ci, f"README's {name} command is not what .ci/run runs"


def test_the_readme_is_short_and_points_to_the_reference_it_moved_out():
    """A newcomer reads the README before the first notebook: what the lab is, the two commands, where to read on."""
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 150
    pages = re.findall(r"\]\((docs/[\w/.-]+\.md)\)", text)
    assert len(pages) >= 8 and all((ROOT / page).is_file() for page in pages)
    site = (ROOT / "docs" / "site" / "index.md").read_text()
    assert all(page.removesuffix(".md") in site for page in pages if page.startswith("docs/reference/"))


def test_the_readme_sets_up_with_the_script_and_states_both_torch_builds_sizes():
    """What doctor says about a CPU-only install (commhooks_lab/course/install_paths.py) is what the README says."""
    assert readme_commands()["setup"].startswith(install_paths.SETUP_COMMAND + " && ")
    section = (ROOT / "README.md").read_text().split("## Two commands")[1].split("\n## ")[0]
    facts = ("DEFAULT_TORCH_DOWNLOAD", "DEFAULT_VENV_SIZE", "CPU_TORCH_DOWNLOAD", "CPU_VENV_SIZE", "CPU_INDEX")
    for fact in facts:
        assert getattr(install_paths, fact) in section, f"README's set-up lacks {fact}"
    assert install_paths.CPU_SETUP_COMMAND in section and "resolves to the CPU build" not in section
    assert install_paths.CPU_SETUP_COMMAND in install_paths.cpu_only_advice()
