"""pytest's assertion-rewritten code of the test modules, written once for every xdist worker.

pytest rewrites the asserts of each test module it imports and caches the result beside it,
unless ``sys.dont_write_bytecode`` (``PYTHONDONTWRITEBYTECODE``, set on the machines we run
on): then every worker, each collecting the whole suite, rewrote every test module again
(3 to 4 s of CPU a worker). Written here, before the workers start, they all read it; a
module changed since is rewritten as before (the cache is keyed on its source's hash).

This uses pytest's own rewriting functions (private: ``constraints.txt`` pins pytest).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.assertion import AssertionState
from _pytest.assertion.rewrite import (
    PYC_TAIL,
    _read_pyc,
    _rewrite_test,
    _write_pyc,
    assertstate_key,
    get_cache_dir,
    try_makedirs,
)


def write_rewritten_tests(config: pytest.Config, tests: Path) -> None:
    """The rewritten code of every module under ``tests`` pytest rewrites on import (test
    modules and conftests), where pytest looks for it, unless already there and current.
    Only when xdist workers will read it: ``-n 0`` rewrites only what it imports, as before."""
    if config.getoption("assertmode") != "rewrite" or config.getoption("dist", "no") == "no":
        return
    state = config.stash[assertstate_key]
    for module in sorted(tests.rglob("*.py")):
        if module.name == "conftest.py" or module.name.startswith("test_"):
            _write_one(config, state, module)


def _write_one(config: pytest.Config, state: AssertionState, module: Path) -> None:
    cache_dir = get_cache_dir(module)
    if not try_makedirs(cache_dir):
        return  # a read-only checkout: the workers rewrite it, as pytest would
    pyc = cache_dir / (module.name[:-3] + PYC_TAIL)
    if _read_pyc(module, pyc, state.trace) is None:
        source_hash, code = _rewrite_test(module, config)
        _write_pyc(state, code, source_hash, pyc)
