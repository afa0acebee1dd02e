"""The docs cannot rot: every command README.md, docs/*.md and results/*/README.md show (in a shell block, a
block with no language, or an inline span) is parsed by the real argument parser it names, read by the rules
docs/layout.md states, and every relative link and image resolves."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import itertools
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from command.cli import SUBCOMMANDS, build_parser
from rlperf.machine import REPO_ROOT
from test_floors import FLOORS

NOT_SHELL = {"toml", "python", "py", "json", "yaml", "yml", "ini", "diff", "html", "csv"}
# modules the docs may show that read no command line
NO_ARGUMENTS = {"rlperf.machine", "benches.peak_probe"}
# a module whose trailing arguments are another command's: checked as that command's
REMAINDER_OF = {"profilers.sampler_cost": "train"}
PYTEST_SESSIONS = {"tests", "bench_micro"}
CAPITAL_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*(?![A-Za-z0-9_])")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
REDIRECTION = re.compile(r"^(\d*>>?|&>|<|\d*>&\d*)(.*)$")
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def documents() -> list[Path]:
    found = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
             *sorted((REPO_ROOT / "results").glob("*/README.md"))]
    return [path for path in found if path.exists()]


# ---- reading Markdown --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shown:
    """A command as a document shows it."""
    path: Path
    line: int
    text: str
    inline: bool

    def where(self) -> str:
        return f"{shown_path(self.path)}:{self.line}: {self.text}"


def shown_path(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def split_fences(text: str) -> tuple[list[tuple[int, str, str]], str]:
    """The fenced blocks (first line number, language, body) and the text outside them, blanked inside."""
    blocks, outside, lines = [], [], text.split("\n")
    index = 0
    while index < len(lines):
        opening = re.match(r"^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)", lines[index])
        if not opening:
            outside.append(lines[index])
            index += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        body_start, index = index + 1, index + 1
        while index < len(lines) and not re.match(rf"^\s{{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[index]):
            index += 1
        blocks.append((body_start + 1, language, "\n".join(lines[body_start:index])))
        outside.extend([""] * (index + 1 - body_start + 1))
        index += 1
    return blocks, "\n".join(outside[:len(lines)])


def shown_commands(path: Path) -> list[Shown]:
    text = path.read_text()
    blocks, outside = split_fences(text)
    shown = []
    for first_line, language, body in blocks:
        if language in NOT_SHELL:
            continue
        pending, pending_line = "", first_line
        for number, line in enumerate(body.split("\n"), first_line):
            if not pending:
                pending_line = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            whole = (pending + line).strip()
            pending = ""
            whole = whole[2:] if whole.startswith("$ ") else whole
            if whole:
                shown.append(Shown(path, pending_line, whole, inline=False))
    for span in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", outside, re.S):
        if "\n\n" in span.group(2):
            continue
        content = " ".join(span.group(2).replace("\\|", "|").split())
        shown.append(Shown(path, outside.count("\n", 0, span.start()) + 1, content, inline=True))
    return shown


# ---- reading a shell line ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    text: str
    quoted: bool  # any part of it was quoted: brackets, bars and `...` in it are the value's own
    alternatives: tuple[str, ...] = ()


class Unreadable(ValueError):
    pass


def shell_commands(line: str) -> list[list[Word]]:
    """The commands of one shell line, as words: quotes resolved, comments, redirections and operators taken out,
    unquoted `[` and `]` their own words, an unquoted `|` inside a word read as alternatives."""
    commands: list[list[Word]] = [[]]
    word, quoted, bars, in_word = "", False, [], False
    index = 0

    def end_word() -> None:
        nonlocal word, quoted, bars, in_word
        if in_word:
            alternatives = ()
            if bars:
                cuts = [0, *[at + 1 for at in bars]]
                alternatives = tuple(word[start:(bars[k] if k < len(bars) else len(word))]
                                     for k, start in enumerate(cuts))
                alternatives = tuple(dict.fromkeys(alternatives))
            commands[-1].append(Word(word, quoted, alternatives))
        word, quoted, bars, in_word = "", False, [], False

    while index < len(line):
        char = line[index]
        if char in " \t":
            end_word()
        elif char == "'":
            closing = line.find("'", index + 1)
            if closing < 0:
                raise Unreadable("an unclosed ' quote")
            word, quoted, in_word = word + line[index + 1:closing], True, True
            index = closing
        elif char == '"':
            index += 1
            while index < len(line) and line[index] != '"':
                if line[index] == "\\" and index + 1 < len(line) and line[index + 1] in '"\\$`':
                    index += 1
                word += line[index]
                index += 1
            if index >= len(line):
                raise Unreadable('an unclosed " quote')
            quoted, in_word = True, True
        elif char == "\\" and index + 1 < len(line):
            word, in_word = word + line[index + 1], True
            index += 1
        elif char == "#" and not in_word:
            break
        elif line.startswith(("&&", "||"), index) or char == ";":
            end_word()
            commands.append([])
            index += 1 if char == ";" else 2
            continue
        elif char == "|" and (not in_word or index + 1 >= len(line) or line[index + 1] in " \t"):
            end_word()
            commands.append([])
        elif char == "|":
            bars.append(len(word))
            word += char
        elif char in "[]" and not quoted:
            end_word()
            commands[-1].append(Word(char, False))
        else:
            word, in_word = word + char, True
        index += 1
    end_word()
    return [drop_redirections(command) for command in commands if command]


def drop_redirections(words: list[Word]) -> list[Word]:
    kept, skip_next = [], False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        match = None if word.quoted else REDIRECTION.match(word.text)
        if match:
            skip_next = not match.group(2)
            continue
        kept.append(word)
    return kept


def variants(words: list[Word]) -> list[list[str]]:
    """The argument lists a command stands for: optional parts in and out, each alternative once."""
    groups: list[tuple[int, int]] = []
    stack = []
    for at, word in enumerate(words):
        if word.text == "[" and not word.quoted:
            stack.append(at)
        elif word.text == "]" and not word.quoted:
            if not stack:
                raise Unreadable("a ] without its [")
            start = stack.pop()
            if not stack:
                groups.append((start, at))
    if stack:
        raise Unreadable("a [ without its ]")
    leave_outs = [(), tuple(groups), *([(group,) for group in groups] if len(groups) > 1 else [])]
    choices = [at for at, word in enumerate(words) if word.alternatives]
    picks = [{}] + [{at: k} for at in choices for k in range(1, len(words[at].alternatives))]
    found = []
    for left_out, pick in itertools.product(leave_outs, picks):
        argv = []
        for at, word in enumerate(words):
            if any(start <= at <= end for start, end in left_out) or word.text in ("[", "]") and not word.quoted:
                continue
            argv.append(word.alternatives[pick.get(at, 0)] if word.alternatives else word.text)
        if argv not in found:
            found.append(argv)
    return found


# ---- what a command calls ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    kind: str  # "rlperf", "nox" or "module"
    name: str  # the module, for "module"
    words: tuple[Word, ...]


def is_python(text: str) -> bool:
    return re.fullmatch(r"python3?(\.\d+)?", text.rsplit("/", 1)[-1]) is not None


def is_output(words: list[Word]) -> bool:
    """`rlperf doctor: error: ...`: a name and a word ending in a colon open a command's output, not a command."""
    return len(words) >= 2 and words[1].text.endswith(":") and not words[1].quoted


def call_of(words: list[Word]) -> Call | None:
    at = 0
    while at < len(words) and not words[at].quoted and ENV_ASSIGNMENT.match(words[at].text):
        at += 1
    if at >= len(words):
        return None
    head, rest = words[at].text, words[at + 1:]
    if head.rsplit("/", 1)[-1] == "rlperf":
        return Call("rlperf", "rlperf", tuple(rest))
    if head == "nox":
        return Call("nox", "nox", tuple(rest))
    if head == "pipx" and [word.text for word in rest[:2]] == ["run", "nox"]:
        return Call("nox", "nox", tuple(rest[2:]))
    if head == "torchrun":
        for index, word in enumerate(rest[:-1]):
            if word.text == "-m":
                return module_call(rest[index + 1].text, rest[index + 2:])
        return None
    if is_python(head) and len(rest) >= 2 and rest[0].text == "-m":
        return module_call(rest[1].text, rest[2:])
    return None


def module_call(module: str, rest: list[Word]) -> Call:
    if module == "rlperf":
        return Call("rlperf", "rlperf", tuple(rest))
    if module == "nox":
        return Call("nox", "nox", tuple(rest))
    return Call("module", module, tuple(rest))


# ---- the parsers, made to raise and to take placeholders ----------------------------------------------------------

class Refused(Exception):
    pass


class Placeholder(str):
    pass


def is_placeholder(text: str) -> bool:
    return CAPITAL_WORD.search(text) is not None


class ChoicesOrPlaceholder(list):
    def __contains__(self, value) -> bool:
        return isinstance(value, Placeholder) or list.__contains__(self, value)


def accepting_placeholders(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The same parser, raising Refused where it would exit, and taking a placeholder wherever a value goes."""
    def refuse(message: str) -> None:
        raise Refused(message)

    parser.error = refuse  # type: ignore[method-assign]
    parser.allow_abbrev = False  # a doc spells each flag out: an abbreviation breaks when a longer flag arrives
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                accepting_placeholders(sub)
            continue
        if action.nargs == 0:
            continue
        original = action.type

        def typed(text: str, original=original):
            if is_placeholder(text):
                return Placeholder(text)
            return original(text) if original is not None else text

        action.type = typed
        if action.choices is not None:
            action.choices = ChoicesOrPlaceholder(action.choices)
    return parser


@cache
def rlperf_parser() -> argparse.ArgumentParser:
    return accepting_placeholders(build_parser(SUBCOMMANDS))


@cache
def rlperf_subparser(name: str) -> argparse.ArgumentParser:
    (subparsers,) = [action for action in rlperf_parser()._actions
                     if isinstance(action, argparse._SubParsersAction)]
    return subparsers.choices[name]


@cache
def module_parser(module: str) -> argparse.ArgumentParser | None:
    """The module's own parser; None for one that reads no command line. Raises Refused for a module that is
    not there, or a project module that builds no parser a test can call."""
    if module.split(".")[0] not in FLOORS:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise Refused(f"no module {module} is installed")
        return None
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError:
        raise Refused(f"no module {module} in this repository") from None
    if module in NO_ARGUMENTS:
        return None
    if not callable(getattr(imported, "build_parser", None)):
        raise Refused(f"{module} has no build_parser(): its command line cannot be checked")
    return accepting_placeholders(imported.build_parser())


@cache
def nox_sessions() -> frozenset[str]:
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text())
    return frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                     and any("session" in ast.unparse(decorator) for decorator in node.decorator_list))


@cache
def nox_parser() -> argparse.ArgumentParser:
    # nox's own options as the docs use them (nox is the runner, not installed in the test environment): any
    # other option fails here until it is added deliberately
    parser = argparse.ArgumentParser(prog="nox", add_help=False)
    parser.add_argument("-s", "--session", "--sessions", dest="sessions", nargs="+", choices=sorted(nox_sessions()))
    for flag in ("--install-only", "--no-install", "-r", "--reuse-existing-virtualenvs", "-R", "-l", "--list"):
        parser.add_argument(flag, action="store_true")
    return accepting_placeholders(parser)


# ---- checking ----------------------------------------------------------------------------------------------------

def parse(parser: argparse.ArgumentParser, argv: list[str], partial: bool) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exit:  # --help
        if exit.code:
            raise Refused(f"exit {exit.code}") from None
    except Refused as refused:
        if partial and re.match(r"the following arguments are required|argument \S+: expected", str(refused)):
            return
        raise


def check_argv(call: Call, argv: list[str], partial: bool) -> None:
    if call.kind == "rlperf":
        parse(rlperf_parser(), argv, partial)
    elif call.kind == "nox":
        cut = argv.index("--") if "--" in argv else len(argv)
        parse(nox_parser(), argv[:cut], partial)
        passed = argv[cut + 1:]
        sessions = nox_parser().parse_args(argv[:cut]).sessions or []
        if passed and "bench" in sessions:
            parse(rlperf_subparser("bench"), passed, partial)
        elif passed and not set(sessions) <= PYTEST_SESSIONS:
            raise Refused(f"no rule for the arguments of nox sessions {sessions}")
    else:
        parser = module_parser(call.name)
        if parser is None:
            if call.name in NO_ARGUMENTS and argv:
                raise Refused(f"{call.name} takes no arguments")
            return
        parse(parser, argv, partial)
        if call.name in REMAINDER_OF and "--" in argv:
            parse(rlperf_subparser(REMAINDER_OF[call.name]), argv[argv.index("--") + 1:], partial)


def problems(shown: Shown) -> list[str]:
    try:
        commands = shell_commands(shown.text)
    except Unreadable as error:
        # output shown in a block may hold any quote: only a line that calls a command must read as shell
        calls = re.match(r"(\S+=\S*\s+)*(\S*/)?(rlperf|nox|python3?|torchrun|pipx)\b", shown.text)
        return [f"{shown.where()}\n    cannot be read: {error}"] if calls and not shown.inline else []
    if commands and is_output(commands[0]):
        return []
    found = []
    for words in commands:
        call = call_of(words)
        if call is None:
            continue
        if shown.inline and call.kind == "rlperf" and not call.words:
            continue
        listed = list(call.words)
        cut = next((at for at, word in enumerate(listed) if word.text in ("...", "…") and not word.quoted), None)
        partial = shown.inline or cut is not None
        listed = listed[:cut]
        try:
            for argv in variants(listed):
                check_argv(call, argv, partial)
        except (Refused, Unreadable) as error:
            found.append(f"{shown.where()}\n    {error}")
    return found


def all_shown() -> list[Shown]:
    return [shown for path in documents() for shown in shown_commands(path)]


def test_every_command_the_docs_show_parses_with_its_real_parser():
    shown = all_shown()
    checked = [item for item in shown if any(call_of(words) for words in safe_commands(item.text))]
    assert len(checked) > 100, "the docs' commands were not found"
    found = [problem for item in shown for problem in problems(item)]
    assert not found, f"{len(found)} documented commands do not parse:\n" + "\n".join(found)


def safe_commands(text: str) -> list[list[Word]]:
    try:
        return shell_commands(text)
    except Unreadable:
        return []


# ---- links -------------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    _, outside = split_fences(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", outside, re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def link_problems(path: Path) -> list[str]:
    _, outside = split_fences(path.read_text())
    outside = re.sub(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", lambda m: " " * len(m.group(0)), outside, flags=re.S)
    targets = [(m.group(3), outside.count("\n", 0, m.start()) + 1) for m in LINK.finditer(outside)]
    targets += [(m.group(1), outside.count("\n", 0, m.start()) + 1) for m in REFERENCE_LINK.finditer(outside)]
    found = []
    for target, line in targets:
        where = f"{shown_path(path)}:{line}: ({target})"
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # a URL
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            found.append(f"{where} is absolute: link within the repository, relatively")
            continue
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(REPO_ROOT.resolve()):
            found.append(f"{where} leaves the repository")
        elif not resolved.exists():
            found.append(f"{where} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            found.append(f"{where}: no heading makes the anchor #{anchor}")
    return found


def test_every_relative_link_and_image_in_the_docs_resolves():
    links = sum(len(LINK.findall(path.read_text())) for path in documents())
    assert links > 20, "the docs' links were not found"
    found = [problem for path in documents() for problem in link_problems(path)]
    assert not found, "\n".join(found)


# ---- the checks themselves fail where they should -----------------------------------------------------------------

def check_text(tmp_path: Path, text: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return [problem for shown in shown_commands(page) for problem in problems(shown)]


@pytest.mark.parametrize("text", [
    "```bash\nrlperf train --num-environments 64\n```",          # a flag renamed
    "```bash\nrlperf train --num-env 64\n```",                   # a flag abbreviated
    "```bash\nrlperf trian --num-envs 64\n```",                  # a subcommand that does not exist
    "```bash\nrlperf bench --launch spawned\n```",               # a value outside the choices
    "```bash\nrlperf bench --repeats 0\n```",                    # a value its type refuses
    "```bash\nrlperf train --num-envs 64 [--cuda-graph]\n```",   # a wrong flag in an optional part
    "```bash\nrlperf bench --device cpu|gpu\n```",               # one alternative its type refuses
    "```bash\nrlperf gate --suite nightly\n```",                 # a required flag missing
    "```bash\nnox -s bench -- --suite smoke --repeat 3\n```",    # bench's flags through nox
    "```bash\nnox -s benchmarks\n```",                           # a nox session that does not exist
    "```bash\npython -m studies.gate_power --nigths 10\n```",    # a study's flag
    "```bash\npython -m studies.no_such_study\n```",             # a module that does not exist
    "```bash\npython -m benches.nightly promote --sha X\n```",   # a step's flag
    "```bash\ntorchrun --nnodes 2 -m rlperf train --world-sise 2\n```",
    "```bash\npython -m profilers.sampler_cost -- --num-env 8\n```",
    "Run `rlperf bench --suite smoke --no-wiat` first.",         # an inline span
    "```bash\nrlperf train --threads 2 \\\n    --horizn 8\n```",  # a continued line
])
def test_a_wrong_command_in_the_docs_fails(tmp_path, text):
    assert check_text(tmp_path, text)


@pytest.mark.parametrize("text", [
    "```bash\nrlperf report STORE::RUN --baseline STORE::RUN --out DIR\n```",
    "```bash\nRLPERF_TORCH=system nox -s bench -- --suite gpu-smoke --device cuda:N  # a comment\n```",
    "```bash\nrlperf train --env memory --dtype fp32|bf16 [--pinned --non-blocking] --inject-delay PHASE=MS\n```",
    "```bash\nrlperf gate --suite nightly ...\n```",
    "See `rlperf gate` and `rlperf bisect GOOD`.",
    "```bash\n.nox/bench/bin/rlperf runs runs/results.sqlite > runs.txt && echo done\n```",
    "```\nforecast: screen 31 min 57 s (16 points x 6 processes)\ngate: the point's screen\n```",
    "```\nrlperf doctor: error: device: none is visible\n```\nIt ends in one line (`rlperf doctor: interrupted`).",
])
def test_placeholders_and_shell_forms_read_as_the_rule_says(tmp_path, text):
    assert check_text(tmp_path, text) == []


def test_a_broken_link_or_anchor_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading-with-code) [gone](missing.md) ![pic](images/none.png) "
                    "[anchor](other.md#nowhere) [out](../outside.md) `[not a link](nowhere.md)`\n")
    found = link_problems(page)
    assert len(found) == 4 and not any("(other.md#a-heading-with-code)" in line for line in found)
