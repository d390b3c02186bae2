"""One way to reach shared code: every module, filter, script and test imports the collection
(`ansible_collections.pdctl.vllm_pd...`) or the pdctl package. Nobody edits the import path, and
nobody walks up the tree to find the repository (pdctl.collection.root() is the one place)."""
import re

import pytest
import yaml

from ansible_collections.pdctl.vllm_pd.plugins.module_utils import upgrade_decide as ud
from pdctl import collection

ROOT = collection.root()
SOURCES = sorted(p for top in ("plugins", "src", "tests", "benchmarks") for p in (ROOT / top).rglob("*.py")
                 if "fixtures" not in p.relative_to(ROOT).parts)
RULES = [
    (re.compile(r"\bsys\.path\s*(\.(insert|append|extend)\b|\+=|\[)"), "edits sys.path"),
    (re.compile(r"__path__\.(append|insert|extend)\b"), "edits a package's __path__"),
    (re.compile(r"\bmodule_util\(|spec_from_file_location\("), "loads shared code by file path"),
    # Going up two or more directories from a file is looking for the repository root.
    (re.compile(r"__file__\)[^\n]*\.parents\[[2-9]\]|\.parent\.parent\.parent"), "walks up to the repository root"),
    (re.compile(r"[\"']ansible\.cfg[\"']\)\.(is_file|exists)\("), "searches for ansible.cfg"),
]


def test_the_rules_catch_what_they_name():
    bad = ['sys.path.insert(0, "x")', "sys.path += ['x']", "ansible.module_utils.__path__.append(p)",
           'repo.module_util("topology")', "ROOT = Path(__file__).resolve().parents[2]",
           'if (parent / "ansible.cfg").is_file():']
    for line in bad:
        assert any(rx.search(line) for rx, _ in RULES), line
    assert not any(rx.search("FIXTURES = Path(__file__).resolve().parents[1] / 'fixtures'") for rx, _ in RULES)


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_import_path_edits_and_no_root_discovery(path):
    if path.name == "test_code_rules.py":
        return
    found = ["%s:%d: %s" % (path.relative_to(ROOT), n, why)
             for n, line in enumerate(path.read_text().splitlines(), 1)
             for rx, why in RULES if rx.search(line)]
    assert not found, "\n".join(found)


# The collection stands alone (issue 36): its plugins never import the pdctl package (the CLI, the lab); pdctl
# imports the collection, never the other way round.
PDCTL_IMPORT = re.compile(r"^\s*(from\s+pdctl(\.[\w.]+)?\s+import\b|import\s+pdctl\b)")
PLUGIN_SOURCES = [p for p in SOURCES if p.relative_to(ROOT).parts[0] == "plugins"]


def test_the_pdctl_import_rule_catches_what_it_names():
    for line in ("from pdctl import outcome", "    from pdctl.gates import sla", "import pdctl.cache", "import pdctl"):
        assert PDCTL_IMPORT.search(line), line
    for line in ("from ansible_collections.pdctl.vllm_pd.plugins.module_utils import outcome", "import pdctlx",
                 "# the rule of pdctl.cache, which this collection does not import"):
        assert not PDCTL_IMPORT.search(line), line


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=[str(p.relative_to(ROOT)) for p in PLUGIN_SOURCES])
def test_plugins_do_not_import_the_pdctl_package(path):
    found = ["%s:%d: %s" % (path.relative_to(ROOT), n, line.strip())
             for n, line in enumerate(path.read_text().splitlines(), 1) if PDCTL_IMPORT.search(line)]
    assert not found, "\n".join(found)

# Issue 36, acceptance 4: where pdctl puts its files on a host is written once, in the defaults layer
# (roles/pdctl_defaults: pdctl_paths); roles, playbooks and modules name it, never the paths themselves.
PATHS_HOME = ROOT / "roles" / "pdctl_defaults"
PATH_LITERAL = re.compile(r"/(opt|etc|var/lib|run)/pdctl(?![\w.-])")
PATH_SOURCES = sorted(p for top in ("roles", "playbooks", "plugins") for p in (ROOT / top).rglob("*")
                      if p.is_file() and PATHS_HOME not in p.parents and "__pycache__" not in p.parts)
# State-directory paths that stay written out, each tied to pdctl_paths.state_dir by
# test_kept_state_paths_are_the_defaults_layers: the modules' defaults and messages (the playbooks pass the
# path: playbooks/vars builds it from pdctl_paths.state_dir) and the filters' documentation of those defaults.
STATE_LITERAL = re.compile(r"/var/lib/pdctl(?![\w.-])")
STATE_KEPT = {"plugins/module_utils/upgrade_decide.py", "plugins/module_utils/rollout_state.py",
              "plugins/filter/upgrade_rolls.yml", "plugins/filter/upgrade_target.yml"}


def _path_literal(path, line):
    """A pdctl path written out on a line that is not a comment (comments may name them)."""
    if line.lstrip().startswith("#") or not PATH_LITERAL.search(line):
        return False
    if str(path.relative_to(ROOT)) in STATE_KEPT:
        return bool(PATH_LITERAL.search(STATE_LITERAL.sub("", line)))
    return True


def test_the_path_rule_catches_what_it_names():
    for line in ("dest: /etc/pdctl/{{ item.name }}.env", "path: /opt/pdctl", 'default="/opt/pdctl/venvs/current/bin/python"',
                 "WorkingDirectory=/var/lib/pdctl", "src: /run/pdctl/{{ item.name }}.config"):
        assert PATH_LITERAL.search(line), line
        assert _path_literal(ROOT / "roles/x.yml", line), line
    for line in ('dest: "{{ pdctl_paths.config_dir }}/x.env"', "/etc/pdctl-store.gpg", "/opt/pdctlx",
                 "/run/pdctl-lab/sys/module/nvidia", "/var/lib/pdctl-lab/sys"):
        assert not PATH_LITERAL.search(line), line
    assert not _path_literal(ROOT / "roles/x.yml", "  # records it under /run/pdctl when it starts")
    # A kept file may write the state directory, and nothing else; playbooks/vars no longer may.
    assert _path_literal(ROOT / "playbooks/vars/upgrade.yml", "x: /var/lib/pdctl/rollout.json")
    kept = ROOT / "plugins/module_utils/upgrade_decide.py"
    assert not _path_literal(kept, "x: /var/lib/pdctl/rollout.json")
    assert _path_literal(kept, "x: /run/pdctl/x") and _path_literal(ROOT / "roles/x.yml", "x: /var/lib/pdctl/y")
    assert "pdctl_paths" in (PATHS_HOME / "defaults" / "main" / "main.yml").read_text() and PATH_SOURCES


def test_pdctl_paths_are_written_only_in_the_defaults_layer():
    found = ["%s:%d: %s" % (path.relative_to(ROOT), n, line.strip())
             for path in PATH_SOURCES
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if _path_literal(path, line)]
    assert not found, "write pdctl_paths (roles/pdctl_defaults/defaults/main/) instead of:\n" + "\n".join(found)


def _render(value, names):
    for name, text in names.items():
        value = value.replace(name, text)
    return value


def test_kept_state_paths_are_the_defaults_layers():
    state = yaml.safe_load((PATHS_HOME / "defaults" / "main" / "main.yml").read_text())["pdctl_paths"]["state_dir"]
    journal, turn, rollout = (state + "/" + name for name in ("release-switch.json", "maintenance-turn.json",
                                                                "rollout.json"))
    assert (ud.JOURNAL_FILE, ud.TURN_FILE) == (journal, turn)
    # What the playbooks pass: the same files, under pdctl_paths.state_dir.
    upgrade = yaml.safe_load((ROOT / "playbooks/vars/upgrade.yml").read_text())
    maintenance = yaml.safe_load((ROOT / "playbooks/vars/maintenance.yml").read_text())
    layer = {"{{ pdctl_paths.state_dir }}": state}
    assert [_render(upgrade[k], layer) for k in ("upgrade_journal_file", "upgrade_rollout_file")] == [journal, rollout]
    assert _render(maintenance["maintenance_turn_file"], layer) == turn
    # Every other written-out state path in a kept file is one of these three.
    for rel in STATE_KEPT:
        text = (ROOT / rel).read_text()
        named = set(re.findall(r"/var/lib/pdctl(?![\w.-])[\w./-]*", text))
        assert named and named <= {journal, turn, rollout}, (rel, named)


# A bench or test reading an inventory's group_vars file by name breaks silently when that file moves into the
# defaults layer (benchmarks/upgrade.py read the lab's serving.yml after it had moved: the decode-flag scenarios
# died at their first kill). Such a file must exist in an inventory it may mean; values are better read through
# pdctl.inventory.load (the inventory's value, else the layer's).
GROUP_VARS_FILE = re.compile(r"""group_vars/all/([\w-]+\.yml)|"group_vars"\s*/\s*"all"\s*/\s*"([\w-]+\.yml)\"""")


def test_group_vars_files_named_by_the_bench_exist():
    inventories = [ROOT / "inventories" / "lab", ROOT / "inventories" / "b300"]
    missing = []
    for top in ("benchmarks", "src", "tests/integration"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for match in GROUP_VARS_FILE.finditer(line):
                    name = match.group(1) or match.group(2)
                    if not any((inv / "group_vars" / "all" / name).exists() for inv in inventories):
                        missing.append("%s:%d: %s" % (path.relative_to(ROOT), n, name))
    assert not missing, "no inventory has these group_vars files (read the value through pdctl.inventory.load):\n" + \
        "\n".join(missing)
