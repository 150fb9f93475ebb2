"""What the doctor is told besides a run's measurements, and what follows from it alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict


@dataclass(frozen=True)
class Facts:
    """What the doctor is told about this machine and data besides the run's measurements (it reads no
    loader code itself: the caller asks the data package)."""

    dali_installed: bool = False  # data.loader=dali could run here
    data_remote: bool = False  # data.root is an object store (s3://, gs://, ...), read without data.cache


def dali_takes(data: Dict[str, Any], facts: Facts) -> bool:
    """data.loader=dali would run this data: DALI installed, and no data.random_erasing (which it refuses)."""
    return (data.get("random_erasing") or 0) <= 0 and facts.dali_installed
