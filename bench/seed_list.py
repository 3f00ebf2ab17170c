"""``--seeds`` of the benchmarks that run over many draws: "1-10", "3,7,11" or "1-4,9"."""
from __future__ import annotations

from typing import List


def seed_list(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out
