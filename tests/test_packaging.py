"""The promises around the code: dependencies in step, README commands that CI really runs."""

import importlib.util
import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_every_runtime_dependency_is_in_environment_yml():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {_name(d) for d in env["dependencies"] if isinstance(d, str)}
    missing = [n for n in map(_name, project["dependencies"]) if CONDA_NAMES.get(n, n) not in conda]
    assert not missing, f"add to environment.yml: {missing}"


def test_constraints_pin_every_runtime_dependency_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {
        _name(line): line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    for name in map(_name, project["dependencies"]):
        assert "==" in pins.get(name, ""), f"constraints.txt must pin {name} exactly"
    assert pins["torch"] == "torch==2.13.0"


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
