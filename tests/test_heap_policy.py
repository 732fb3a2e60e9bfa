"""The C heap policy every runtime process applies at start (``memtrim.apply_policy``) and the heap
figures every pod exports (``memtrim.heap_usage``), checked in fresh interpreters against glibc itself.

What the policy changes: under glibc's default a freed large chunk raises the mmap threshold, so the
next buffers of that size come out of the heap (where they fragment it once freed); with the fixed
policy they are still mapped on their own. Each case runs in its own process, because the threshold's
state is the process's and this test process has long since moved it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from txnkeeper import memtrim

pytestmark = pytest.mark.skipif(memtrim.heap_usage() is None, reason="glibc's mallinfo2 is not here")

_PROBE = """
import json, sys
from txnkeeper import memtrim
applied = memtrim.apply_policy(sys.argv[1])
big = bytearray(4 * 1024 * 1024)  # mapped on its own under either policy
del big  # glibc's default now raises its threshold to 4 MiB
before = memtrim.heap_usage()
buffers = [bytearray(512 * 1024) for _ in range(8)]  # 4 MiB of buffers of a size seen in a store
during = memtrim.heap_usage()
print(json.dumps({"applied": applied, "mmapped_grew": during.mmapped - before.mmapped,
                  "in_use_grew": during.in_use - before.in_use}))
"""


def probe(policy: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, policy], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, int] = json.loads(done.stdout)
    return result


def test_with_the_fixed_policy_large_buffers_stay_out_of_the_heap_after_a_large_one_was_freed() -> None:
    fixed = probe("fixed")
    assert fixed["applied"] is True
    assert fixed["mmapped_grew"] >= 4 * 1024 * 1024  # each buffer its own mapping, given back when freed
    assert fixed["in_use_grew"] < 1024 * 1024
    default = probe("glibc")
    assert default["applied"] is False
    assert default["mmapped_grew"] < 1024 * 1024  # glibc's raised threshold put them in the heap
    assert default["in_use_grew"] >= 4 * 1024 * 1024


def test_an_unknown_policy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'jemalloc' is unknown: 'fixed' .* or 'glibc'"):
        memtrim.apply_policy("jemalloc")
