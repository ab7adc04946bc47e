"""The README's Python example runs as written (a doc that drifted from the
API would fail here, not in a user's first try)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    """The fenced ```python blocks of the README's "## Python" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_the_readme_has_its_python_example() -> None:
    assert len(_python_blocks()) == 1


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    [example] = _python_blocks()
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # The request id it prints, then one line per stage event, ending with
    # the terminal stage.
    assert re.fullmatch(r"[0-9a-f]{32}", lines[0]), lines
    stages = [line.split()[0] for line in lines[1:]]
    assert stages[0] == "SENT" and stages[-1] == "FULFILLED", lines
    assert "PARTIAL" in stages, lines
