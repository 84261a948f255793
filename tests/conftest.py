"""Session fixtures: the fixture libraries must be built, the demo's release check runs once, and
the tests' own plain loader is built once."""

import json

import hypothesis
import pytest

from support import LEGACY_PLUGIN, build_loader, loadfuzz

# The tests' own property checks (not loadfuzz's search): no per-example deadline, which a
# loaded CI machine can miss, and no example database in the working folder, whose saved
# failure would replay in every later run.
hypothesis.settings.register_profile("loadfuzz-tests", deadline=None, database=None)
hypothesis.settings.load_profile("loadfuzz-tests")


@pytest.fixture(scope="session", autouse=True)
def fixtures_are_built():
    assert LEGACY_PLUGIN.exists(), "run `make` first: the fixture libraries are not built"


@pytest.fixture(scope="session")
def legacy_matrix(tmp_path_factory):
    """The release check of the demo, run once: executorch 1.5.1 plus the legacy plugin.

    Returns (summary, every trial record) as JSON objects.
    """
    out = tmp_path_factory.mktemp("legacy-matrix")
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--out", out, "--json")
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    return json.loads(done.stdout), records


@pytest.fixture(scope="session")
def loader(tmp_path_factory):
    """The tests' own plain loader (`loader g:PATH l:PATH ...`): one fresh process per order."""
    return build_loader(tmp_path_factory.mktemp("loader"))
