"""The built wheel installs into a fresh venv and works there."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import venv
from pathlib import Path

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


def test_wheel_installs_into_a_fresh_venv(tmp_path: Path) -> None:
    wheel = _wheel()
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(env_dir)
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
