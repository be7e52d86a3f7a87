"""Shared fixtures: small pagers (tens of MiB) so the suite runs in a minute or two."""

import gc

import pytest

import uswap

MiB = 1 << 20


@pytest.fixture
def pager():
    """A thread-mode pager with an 8 MiB budget and a 256 MiB compressed pool."""
    p = uswap.Pager(limit=8 * MiB, devices="zpool:256MiB", fault_mode="thread")
    yield p
    # Arrays and regions of the test go first, so the next test starts from a clean process.
    gc.collect()
