"""What the classifier returns: diagnoses with their evidence, per kernel and per candidate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.kb import matching
from kb_mcp.kb.models import Primary, Secondary, Signature
from kb_mcp.policy.classify.thresholds import RULE_WEIGHT


class Evidence(BaseModel):
    """One metric behind a classification: its value, the threshold it crossed, and what it means."""

    model_config = ConfigDict(extra="forbid")

    metric: str  # canonical KernelMetrics name, a derived quantity's name, or 'rule:<RuleId>.<what>'
    value: float
    threshold: float | None = None
    relation: str = ""  # '>=', '<', ... : how value stands to threshold
    note: str = ""


class RuleSupport(BaseModel):
    """A profiler rule finding that agrees with the classification."""

    model_config = ConfigDict(extra="forbid")

    rule: str
    estimated_speedup_pct: float | None = None
    message: str = ""


class Diagnosis(BaseModel):
    """One candidate cause for a kernel's slowness, with how strongly the metrics support it."""

    model_config = ConfigDict(extra="forbid")

    primary: Primary
    secondary: Secondary | None
    strength: float  # 0..1 from the metrics alone
    evidence: list[Evidence] = Field(default_factory=list)
    rules: list[RuleSupport] = Field(default_factory=list)
    specific: bool = True  # a named cause (detector) rather than the throughput fallback

    @property
    def key(self) -> str:
        """'primary/secondary', the KB's signature key."""
        return f"{self.primary.value}/{self.secondary.value if self.secondary else '-'}"

    @property
    def score(self) -> float:
        """Strength plus the weight of the best supporting rule's estimated speedup."""
        best = max((r.estimated_speedup_pct or 0.0 for r in self.rules), default=0.0)
        return self.strength + RULE_WEIGHT * min(best, 100.0) / 100.0


class KernelClassification(BaseModel):
    """The classification of one kernel (or of a group of identical launches)."""

    model_config = ConfigDict(extra="forbid")

    index: int  # launch index of the instance classified (the heaviest of its group)
    name: str
    instances: int = 1  # identical launches (same full name, grid and block) folded into this entry
    duration_ns: float = 0.0  # summed over the instances
    time_share: float = 0.0  # of the profile's GPU time
    primary: Primary | None = None
    secondary: Secondary | None = None
    confidence: float = 0.0
    evidence: list[Evidence] = Field(default_factory=list)
    rules: list[RuleSupport] = Field(default_factory=list)
    alternatives: list[str] = Field(default_factory=list)  # other causes that fired: 'key (score)'
    note: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)  # the metrics to match KB ranges against
    # headline metrics (signals.HEADLINE) the classification went without: it may match a KB state, but
    # a signature read partly from assumptions never becomes a new state of the shared KB
    missing: list[str] = Field(default_factory=list)

    @property
    def key(self) -> str | None:
        """'primary/secondary', or None when nothing could be concluded."""
        if self.primary is None:
            return None
        return f"{self.primary.value}/{self.secondary.value if self.secondary else '-'}"

    def signature(self) -> Signature | None:
        """The observed signature (pair plus point ranges of the metrics), for KB matching."""
        if self.primary is None:
            return None
        return matching.signature_from_metrics(self.primary, self.secondary, self.metrics)


class ProfileClassification(BaseModel):
    """Heavy kernels (heaviest first) and the candidate as a whole."""

    model_config = ConfigDict(extra="forbid")

    kernels: list[KernelClassification] = Field(default_factory=list)
    overall: KernelClassification | None = None
    basis: str = ""  # how `overall` was reached
    counters_available: bool = True
