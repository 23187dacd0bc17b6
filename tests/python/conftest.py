"""What every Python test module shares: the rule for the data the
repository may not ship (fixtures/README.md).

A test that needs it is skipped, with a reason that begins "needs
PREP_EXTERNAL_DATA", where the variable is not set. Where it is set (CI sets
it), such a skip is a failure: the data was promised and the test did not
run, which must not pass as a skip.
"""

from __future__ import annotations

import os

import pytest

NEEDS_EXTERNAL = "needs PREP_EXTERNAL_DATA"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get("PREP_EXTERNAL_DATA")):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if NEEDS_EXTERNAL in reason:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} was skipped ({reason}) although PREP_EXTERNAL_DATA is set "
                           f"to {os.environ['PREP_EXTERNAL_DATA']}")


@pytest.fixture(autouse=True, scope="session")
def _tokenizer_cache(tmp_path_factory):
    """Compiled tokenizers (prep.Tokenizer's, and the prep runs') go to the
    session's temporary directory, not the user's cache."""
    if "PREP_TOKENIZER_CACHE" not in os.environ:
        os.environ["PREP_TOKENIZER_CACHE"] = str(tmp_path_factory.mktemp("tokenizer-cache"))
    yield
