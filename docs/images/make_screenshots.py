"""Make docs/images/report.png: the report of a real demo run, rendered by headless
Chromium (Debian package ``chromium``).

    python docs/images/make_screenshots.py [OUT.png]

It runs the demo (``python -m runtime demo``, in-process workers) with a monitoring
database, makes its report (``python -m runtime report``) and takes a screenshot of the
report's first screen. tests/test_report.py runs it into a temporary directory; run
``CORRAL_SCREENSHOTS=docs/images pytest tests/test_report.py tests/test_dashboard.py``
to retake the pictures in docs/monitoring.md from the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "images" / "report.png"
SIZE = (1400, 1800)
HOW = "on Debian or Ubuntu: `apt-get install -y --no-install-recommends chromium`"


def chromium() -> str | None:
    """The Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(argv: list[str], cwd: Path, timeout: float) -> str:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout


def demo_report(work: Path) -> tuple[Path, Path, str]:
    """Run the demo with a monitoring database in ``work``, then its report: the
    database, the report and the demo's output."""
    db, html = work / "monitoring.db", work / "report.html"
    out = _run(
        [sys.executable, "-m", "runtime", "demo", "--no-progress", "--datasets", "3",
         "--chunks", "32", "--monitoring", str(db)],
        work, 300,
    )  # fmt: skip
    _run([sys.executable, "-m", "runtime", "report", str(db), "-o", str(html)], work, 300)
    return db, html, out


def screenshot(html: Path, png: Path, browser: str, size: tuple[int, int] = SIZE) -> Path:
    """Render ``html`` in headless ``browser`` and save its first screen to ``png``."""
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--screenshot={png}",
             f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=10000",
             html.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return png


def main(out: Path = OUT) -> Path:
    browser = chromium()
    if browser is None:
        raise SystemExit(f"no Chromium: {HOW}")
    with tempfile.TemporaryDirectory() as tmp:
        _, html, _ = demo_report(Path(tmp))
        return screenshot(html, out, browser)


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
