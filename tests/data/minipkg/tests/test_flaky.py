"""A deliberately flaky test: it fails on every second run that shares /tmp (the 8-rerun gate
must catch it)."""

import os

from minicalc import count_vowels


def test_vowels_flaky():
    path = "/tmp/minicalc-flaky-counter"
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    assert count_vowels("queue") == 4
    assert n % 2 == 1
