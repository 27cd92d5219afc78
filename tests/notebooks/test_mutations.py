"""The notebook checks have teeth: break the arithmetic on purpose and both strict and tolerant mode fail.

Each mutation runs one notebook from the top in a clean kernel (``tests/notebooks/mutations/sitecustomize.py`` patches
the kernel, the rank server and every rank) and compares it with the committed outputs twice: strictly
(nbval's rule) and within the notebook's stated tolerances (``--lab-tolerant``), cell after cell, until a cell
fails both (the rest of the notebook would only repeat the verdict). A check that passed a mutated
run would not be a regression check.
"""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from commhooks_lab.launcher.numerics import PORTABLE_VARIABLES
from commhooks_lab.testing import compare_notebooks

ROOT = Path(__file__).resolve().parents[2]
MUTATIONS_DIR = Path(__file__).resolve().parent / "mutations"
#: mutation -> (environment it needs, the notebook that shows it)
MUTATIONS = {
    "fp16 divides after the sum": ({"COMMHOOKS_LAB_MUTATION": "fp16_divides_after_the_sum"}, "03_fp16_vs_bf16"),
    "PowerSGD matrix rank 1 -> 2": ({"COMMHOOKS_LAB_MUTATION": "powersgd_matrix_rank_two"}, "01_quickstart"),
    "one byte more on the wire": ({"COMMHOOKS_LAB_MUTATION": "one_more_byte"}, "01_quickstart"),
    "another data seed": ({"COMMHOOKS_LAB_SEED_SET": "1"}, "01_quickstart"),
}

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def failing(committed, fresh, tolerant: bool) -> dict[int, str]:
    return {r.cell: r.problem for r in compare_notebooks(committed, fresh, tolerant=tolerant) if not r.same}


def execute(name: str, env: dict[str, str]) -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    """(committed, re-executed under ``env``) for notebook ``name``, executed in a clean kernel from the top until
    a cell fails both checks (the cells not run yet keep their committed outputs, which compare equal)."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    committed = nbformat.read(path, as_version=4)
    fresh = nbformat.read(path, as_version=4)
    inherited = {k: v for k, v in os.environ.items() if k not in PORTABLE_VARIABLES}
    pythonpath = os.pathsep.join(filter(None, [str(MUTATIONS_DIR), os.environ.get("PYTHONPATH")]))
    resources = {"metadata": {"path": str(path.parent)}}
    client = NotebookClient(fresh, timeout=300, kernel_name="python3", resources=resources)
    with client.setup_kernel(env={**inherited, "PYTHONPATH": pythonpath, **env}):
        for index, cell in enumerate(fresh.cells):
            client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
            if cell.cell_type == "code" and failing(committed, fresh, False) and failing(committed, fresh, True):
                break
    return committed, fresh


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_mutation_fails_the_notebook_check_strict_and_tolerant(mutation):
    env, notebook = MUTATIONS[mutation]
    committed, fresh = execute(notebook, env)
    strict, tolerant = failing(committed, fresh, False), failing(committed, fresh, True)
    print(f"\n{mutation} ({notebook}): strict fails cells {sorted(strict)}; tolerant fails cells {sorted(tolerant)}")
    for cell, problem in tolerant.items():
        print(f"  cell {cell}: {problem[:200]}")
    assert strict, f"{mutation}: strict mode saw nothing"
    assert tolerant, f"{mutation}: tolerant mode saw nothing"
    assert set(tolerant) <= set(strict)


def _patch_installed(mutation: str) -> str:
    """What a fresh interpreter with the mutations folder on its path says: is a patch waiting for its module?"""
    code = "import sys; print(any(type(f).__name__ == '_PatchAfterImport' for f in sys.meta_path))"
    env = {**os.environ, "PYTHONPATH": str(MUTATIONS_DIR), "COMMHOOKS_LAB_MUTATION": mutation}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or out.stderr


def test_without_a_mutation_the_hook_patches_nothing():
    """The control: the unmutated notebooks pass nbval with this folder absent; with it present and no mutation
    named, it installs nothing (so every failure above is the mutation's)."""
    assert _patch_installed("") == "False"
    assert _patch_installed("one_more_byte") == "True"
