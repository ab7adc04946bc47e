"""The built wheel installs into a fresh venv and works there."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, askpool

async def main():
    async with askpool.Node() as node:
        pool = node.pool("echo")

        @pool.handler
        async def echo(msg, ctx):
            return msg

        payload = object()
        assert await node.ask("echo", payload, timeout=5) is payload
        print("fresh venv ok", askpool.__file__)

asyncio.run(main())
"""


def _wheel() -> str:
    given = os.environ.get("ASKPOOL_WHEEL")
    if given:
        return given
    found = sorted(glob.glob(str(ROOT / "target" / "wheels" / "askpool-*.whl")))
    if not found:
        pytest.skip("no wheel built yet: run `cargo xtask python`")
    return found[-1]


def _python39() -> Optional[str]:
    """An interpreter of the oldest supported version, if this machine has one."""
    candidates = [shutil.which("python3.9") or ""]
    # Where pyenv keeps its versions, as xtask looks (PYENV_ROOT, else ~/.pyenv).
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv, "versions/3.9*/bin/python3.9")))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("interpreter", ["this", "3.9"])
def test_wheel_installs_into_a_fresh_venv(tmp_path: Path, interpreter: str) -> None:
    wheel = _wheel()
    env_dir = tmp_path / "fresh"
    if interpreter == "this":
        venv.EnvBuilder(with_pip=False).create(env_dir)
    else:
        # The abi3 wheel is built against 3.9: the same file must work there.
        base = _python39()
        if base is None:
            pytest.skip("no Python 3.9 on this machine")
        subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    # This interpreter's pip installs into the new venv (no download of pip).
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-deps", wheel],
        check=True,
    )
    out = subprocess.run(
        [str(python), "-c", SCRIPT], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert "fresh venv ok" in out.stdout
    assert str(env_dir) in out.stdout
