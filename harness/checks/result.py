"""What a sanity check returns: its name, verdict, value against the threshold, and details for the one-line report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CheckResult:
    name: str
    passed: bool
    value: float
    threshold: float
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        extra = ", ".join(f"{k} {v}" for k, v in self.details.items())
        return f"{verdict}  {self.name}: {self.value:.3f} (threshold {self.threshold}){'; ' + extra if extra else ''}"
