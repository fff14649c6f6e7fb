"""The `sandbox_attempt` finding: what a verdict says of the attempts its candidate's processes made.

The attempts come from the server's own record (`harness.sandbox.watch`, into an `attempts.AttemptLog`),
never from what the worker answered: a candidate cannot add, drop or word one. By the server's
policy (`attempts.policy`) the verdict stays as measured and is flagged (held for review, never
credited), or becomes `invalid`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kb_mcp.harness.judgment.verdict import Finding, FindingCode, VerifyResult
from kb_mcp.harness.profile_model import Profile
from kb_mcp.harness.protocol import CensusReply
from kb_mcp.harness.sandbox.attempts import Attempt, AttemptLog, Policy, policy
from kb_mcp.kb.models import Verdict

SHOWN = 6  # attempts named in the finding's message; the rest are counted


def finding(attempts: list[Attempt]) -> Finding:
    """The finding that names what was tried (redacted when recorded)."""
    lines = [a.line() for a in attempts[:SHOWN]]
    more = f"; and {len(attempts) - SHOWN} more" if len(attempts) > SHOWN else ""
    return Finding(code=FindingCode.sandbox_attempt, source="sandbox",
                   message=f"the candidate tried what the sandbox refuses: {'; '.join(lines)}{more}. "
                           "Nothing of it reached outside the sandbox; remove it from the candidate")


def with_attempts(result: VerifyResult, seen: AttemptLog, rule: Policy | None = None) -> VerifyResult:
    """`result` with the server's record of attempts: the finding (replacing any of the same code the
    worker sent), flagged, or `invalid` under the `invalid` policy; where some process could not be
    watched, `attempts` says so."""
    record = "recorded" if not seen.unrecorded else "not recorded: " + "; ".join(sorted(seen.unrecorded))
    findings = [f for f in result.findings if f.code != FindingCode.sandbox_attempt]
    attempts = seen.attempts
    if not attempts:
        return result.model_copy(update={"findings": findings, "attempts": record})
    found = finding(attempts)
    update: dict[str, object] = {"findings": [*findings, found], "attempts": record, "flagged": True}
    if (rule or policy()) == "invalid":
        update["verdict"] = Verdict.invalid
        update["summary"] = f"invalid (sandbox_attempt): {found.message}"
    else:
        update["summary"] = f"{result.summary} [flagged: sandbox_attempt: {found.message}]"
    return result.model_copy(update=update)


def census_with_attempts(reply: CensusReply, seen: AttemptLog) -> CensusReply:
    """A census reply with the server's record of attempts among its findings."""
    findings = [f for f in reply.findings if f.code != FindingCode.sandbox_attempt]
    if seen.attempts:
        findings.append(finding(seen.attempts))
    return reply.model_copy(update={"findings": findings})


def profile_with_attempt(profile: Profile, seen: AttemptLog) -> Profile:
    """A profile with the finding's text, when its driver, ncu or export tried anything."""
    attempts = seen.attempts
    return profile.model_copy(update={"attempt": finding(attempts).message}) if attempts else profile


@contextlib.contextmanager
def naming_attempts(seen: AttemptLog, error: type[Exception]) -> Iterator[None]:
    """Work that fails with `error` itself (the candidate's fault, its message says why) names what
    its processes tried too; subclasses (other failures) pass unchanged."""
    try:
        yield
    except error as exc:
        if type(exc) is not error or not seen.attempts:
            raise
        raise error(f"{exc} [flagged: sandbox_attempt: {finding(seen.attempts).message}]") from exc
