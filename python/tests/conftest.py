"""Runs `async def` tests on a fresh event loop each (no plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Iterator

import pytest

from askpool import _native

#: No test may hang the suite.
TEST_TIMEOUT = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**args), TEST_TIMEOUT))
    return True


@pytest.fixture(params=["C functions", "Python calls"])
def send_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both ways the extension runs a handler's first step: with
    `PyContext_Enter` and `PyIter_Send` (Python >= 3.10), or with
    `Context.run` and the `send` method, `StopIteration` and all (3.9)."""
    _native._send_through_method(request.param == "Python calls")
    try:
        yield request.param
    finally:
        _native._send_through_method(False)
