"""The package reads as the pipeline: one job per module, no module too long, no import cycle
(imports inside functions count), and nothing in the repository points outside it."""

import ast
import re
import subprocess

from support import ROOT

PACKAGE = ROOT / "loadfuzz"
MOST_LINES = 450


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path, modules):
    """Every loadfuzz module this file imports, at any depth of its code, inside functions too
    (`from P import M` of a module M counts as P.M)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for block in ast.walk(tree):  # `if TYPE_CHECKING:` imports never run: they are no edge
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING"):
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("loadfuzz")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loadfuzz"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def graph():
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {target for target in imports(path, modules) if target in modules and target != name}
            for name, path in modules.items()}


def cycle(edges):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                return [*stack[stack.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_back_through_others():
    assert cycle(graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_module_opens_with_a_docstring_and_stays_short():
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} does not say what its job is"
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MOST_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def test_nothing_points_outside_the_repository():
    """A clone carries all a user needs: no tracked file names the workplace it was built in
    (its shared folder, its tool library, its paths) or the spec the contract grew from."""
    outside = re.compile(r"\.\./shared|shared/seeds|CONTRACT\.md|\.\./\.library|/work/")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    assert len(tracked) > 50
    for name in filter(None, tracked):
        if name == "tests/test_layout.py" or not (ROOT / name).is_file():
            continue
        text = (ROOT / name).read_bytes().decode("utf-8", "replace")
        assert not outside.search(text), name


def test_the_harness_loadfuzz_and_the_docs_name_one_protocol_version():
    from loadfuzz.run.harness import PROTOCOL_VERSION

    in_c = re.search(r"#define PROTOCOL_VERSION (\d+)", (ROOT / "harness_c" / "harness.c").read_text())
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    index = (ROOT / "docs" / "README.md").read_text()
    assert in_c is not None and int(in_c[1]) == PROTOCOL_VERSION
    assert protocol.startswith(f"# The harness protocol, version {PROTOCOL_VERSION}\n")
    assert f"| {PROTOCOL_VERSION} | " in protocol  # its line in the table of changes
    assert f"the harness protocol (version {PROTOCOL_VERSION})" in index


def test_every_option_of_every_command_says_what_it_does_in_its_help():
    from loadfuzz.cli.parser import build_parser

    parser = build_parser()
    silent = [f"{name} {action.option_strings or action.dest}"
              for name, command in parser._subparsers._group_actions[0].choices.items()
              for action in command._actions
              if not action.help and action.dest != "help"]
    assert silent == []
