"""The documentation's code blocks, as the docs tests read and check them."""

from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core import management
from django.core.management.base import CommandError

from tests.support import ROOT

#: Commands that only read (or, for the sweep, do what the sweep does anyway): run for real.
RUNNABLE = {"zeroloss_status", "zeroloss_verify", "zeroloss_sweep", "zeroloss_nodes", "check"}


#: Options that make a runnable command loop until a signal: parse only.
LOOPING = {"--loop", "--watch"}


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # line of the opening fence, 1-based
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (indented ones in list items too)."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = len(match["indent"]), match["fence"], match["info"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(
            rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]
        ):
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            j += 1
        found.append(Block(path, i + 1, info, "\n".join(body) + "\n"))
        i = j + 1
    return found


def check_manage(block: Block, argv: list[str]) -> None:
    """The command exists, its own parser accepts the arguments; read-only ones are run."""
    assert argv, f"{block.where}: 'python manage.py' without a command"
    name, args = argv[0], argv[1:]
    commands = management.get_commands()
    assert name in commands, f"{block.where}: no management command {name!r}"
    command = management.load_command_class(commands[name], name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(args)
    except (CommandError, SystemExit) as exc:
        pytest.fail(f"{block.where}: manage.py {shlex.join(argv)}: arguments rejected: {exc}")
    runnable = name in RUNNABLE and not LOOPING & set(args)
    if name == "zeroloss_nodes":
        runnable = runnable and bool(args) and args[0] == "list"
    if runnable:
        out, err = io.StringIO(), io.StringIO()
        try:
            management.call_command(name, *args, stdout=out, stderr=err)
        except CommandError as exc:
            pytest.fail(
                f"{block.where}: manage.py {shlex.join(argv)} failed ({exc.returncode}): {exc}\n"
                f"{out.getvalue()}{err.getvalue()}"
            )
