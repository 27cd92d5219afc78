"""Take the site's picture of the dashboard: the browser test's own run, in real JupyterLab and Chromium.

    python scripts/dashboard_picture.py    # writes docs/images/dashboard.png

A static page cannot run the widget, so the site shows what a learner sees after choosing a hook
and clicking Run. The picture comes from tests/browser/test_dashboard_in_jupyterlab.py, which
checks the same dashboard as it takes it; rerun this when the dashboard changes.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = ROOT / "tests" / "browser" / "test_dashboard_in_jupyterlab.py"
PICTURE = ROOT / "docs" / "images" / "dashboard.png"


def main() -> int:
    with tempfile.TemporaryDirectory() as shots:
        env = {**os.environ, "COMMHOOKS_SCREENSHOTS": shots}
        ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", str(TEST)], cwd=ROOT, env=env)
        taken = Path(shots) / "dashboard_widget.png"
        if ran.returncode != 0 or not taken.exists():
            print("the browser test failed: no picture taken", file=sys.stderr)
            return 1
        PICTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(taken, PICTURE)
    print(f"wrote {PICTURE} ({PICTURE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
