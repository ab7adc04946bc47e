"""Runs `async def` tests on a fresh event loop each (no plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

#: No test may hang the suite.
TEST_TIMEOUT = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIMEOUT))
    return True
