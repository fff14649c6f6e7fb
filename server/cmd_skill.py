"""`kb-mcp install-skill`: put the kb-mcp Skill where Claude Code finds it.

The Skill (a SKILL.md shipped in this package) teaches an agent the optimization round with the
kb-mcp tools. Claude Code reads personal skills from ~/.claude/skills/<name>/ and a project's from
.claude/skills/<name>/ in the project.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.errors import storage_error
from kb_mcp.server import exit_status

SKILL_NAME = "cuda-kernel-optimization"


def skill_text() -> str:
    """The shipped SKILL.md."""
    return resources.files("kb_mcp.clients").joinpath("skills").joinpath(SKILL_NAME).joinpath("SKILL.md").read_text()


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `install-skill` command."""
    p = sub.add_parser(
        "install-skill",
        help="install the kb-mcp Skill for Claude Code (the optimization round with these tools)",
        description="Writes the Skill to ~/.claude/skills/" + SKILL_NAME + "/SKILL.md (every project), "
        "to .claude/skills/ of the current folder with --project, or under --dir.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--project", action="store_true", help="install into ./.claude/skills (this project only)")
    where.add_argument("--dir", metavar="DIR",
                       help="install into DIR/" + SKILL_NAME + "/ (a skills folder of your choice)")
    p.add_argument("--force", action="store_true", help="replace a SKILL.md there that differs from this version's")
    p.add_argument("--print", action="store_true", help="print the Skill instead of installing it")
    p.set_defaults(func=run)


def target_dir(args: argparse.Namespace) -> Path:
    """The skills folder the command writes into."""
    if args.dir:
        return Path(args.dir).expanduser().resolve()
    if args.project:
        return Path.cwd() / ".claude" / "skills"
    return Path.home() / ".claude" / "skills"


def run(args: argparse.Namespace) -> int:
    """Installs (or prints) the Skill; the caller's status (1) when an edited copy is in the way."""
    text = skill_text()
    if args.print:
        print(text, end="")
        return exit_status.OK
    dest = target_dir(args) / SKILL_NAME / "SKILL.md"
    try:
        return _install(dest, text, force=args.force)
    except OSError as exc:  # a file where a folder should be, permissions, a full disk: the machine's
        raise storage_error(exc, "install the Skill at", dest) from exc


def _install(dest: Path, text: str, *, force: bool) -> int:
    if dest.exists():
        if dest.read_text() == text:
            print(f"the Skill is already installed at {dest}")
            return exit_status.OK
        if not force:
            print(f"kb-mcp install-skill: {dest} exists and differs from this version's Skill (edited, or "
                  "from another version); pass --force to replace it", file=sys.stderr)
            return exit_status.CALLER
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, text)
    print(f"installed the Skill {SKILL_NAME} at {dest}")
    print(
        "Claude Code loads it in new sessions; it uses the kb-mcp MCP server (claude mcp add kb-mcp -- kb-mcp serve)."
    )
    return exit_status.OK
