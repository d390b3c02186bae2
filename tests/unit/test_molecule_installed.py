"""molecule/installed: the installed collection deploys pdctl.vllm_pd.site from an inventory of hosts and secrets
only. Its inventory holds the lab's hosts, how to reach them and its secrets; everything else the lab sets is the
bench's, passed as extra vars, file by file. These tests keep that split honest: a value the lab adds to its
inventory must be listed as the bench's (else the scenario's run would differ from the lab's and the lab suite's
second run would change something); a value that is not a secret may not hide in the scenario's inventory."""
import yaml

from collection_build import INSTALLED_SCENARIO as SCENARIO
from collection_build import installed_scenario_args as _args
from inventories import ROOT

LAB = ROOT / "inventories" / "lab"


def _names(path):
    return set(yaml.safe_load(path.read_text()) or {})


def test_the_scenario_inventory_is_hosts_connection_and_secrets():
    inventory = SCENARIO / "inventory"
    files = sorted(str(p.relative_to(inventory)) for p in inventory.rglob("*") if p.is_file())
    assert files == ["group_vars/all/connection.yml", "group_vars/all/vault.yml", "hosts.yml"]
    assert _args()[0] == "--inventory=%s" % inventory
    # How to reach the hosts, and where the lab keeps the files that hold its secrets.
    connection = _names(inventory / "group_vars" / "all" / "connection.yml")
    assert connection and all(n.startswith("ansible_") or n == "pdctl_lab_dir" for n in connection), connection
    # The secrets are the ones production keeps in Vault (vault.yml.example), plus the Hub token.
    production_secrets = _names(ROOT / "inventories" / "b300" / "group_vars" / "all" / "vault.yml.example")
    assert _names(inventory / "group_vars" / "all" / "vault.yml") == production_secrets | {"pdctl_hf_token"}
    # hosts.yml: groups and addresses, no variables beside them.
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())

    def host_vars(group):
        found = set(group.get("vars", {}))
        for vars_ in (group.get("hosts") or {}).values():
            found |= set(vars_ or {}) - {"ansible_host"}
        for child in (group.get("children") or {}).values():
            found |= host_vars(child or {})
        return found
    assert host_vars(hosts["all"]) == set()


def test_every_other_lab_value_is_passed_as_the_benchs_extra_vars():
    benched = [a.split("=@", 1)[1] for a in _args()[1:] if a.startswith("--extra-vars=@")]
    assert len(benched) == len(_args()) - 1, "an argument that is not the inventory nor a bench file: %s" % _args()
    lab_files = {str(p) for p in (LAB / "group_vars" / "all").glob("*.yml")}
    in_inventory = {str(LAB / "group_vars" / "all" / n) for n in ("connection.yml", "vault.yml")}
    # Where this checkout keeps the lab's run records: neither the bench's nor the site's; the scenario keeps the
    # collection's default (beside its inventory, never inside the installed collection).
    checkout = LAB / "group_vars" / "all" / "artifacts.yml"
    assert _names(checkout) == {"pdctl_artifacts_dir"}
    assert sorted(benched) == sorted(lab_files - in_inventory - {str(checkout)})
    assert not any("pdctl_artifacts_dir" in (yaml.safe_load(open(f)) or {}) for f in benched)
    # The scenario's inventory is the lab's own files (links), so the two cannot drift apart.
    for name in ("hosts.yml", "group_vars/all/connection.yml", "group_vars/all/vault.yml"):
        assert (SCENARIO / "inventory" / name).resolve() == (LAB / name).resolve()


def test_the_converge_deploys_the_installed_collections_site():
    plays = yaml.safe_load((SCENARIO / "converge.yml").read_text())
    assert plays[0]["ansible.builtin.import_playbook"] == "pdctl.vllm_pd.site"
    config = yaml.safe_load((SCENARIO / "molecule.yml").read_text())
    # Only the installed copy: no collection of the venv (this checkout's link), no role of this checkout.
    assert config["ansible"]["env"]["ANSIBLE_COLLECTIONS_SCAN_SYS_PATH"] == "false"
    assert config["ansible"]["env"]["ANSIBLE_COLLECTIONS_PATH"].startswith("${MOLECULE_EPHEMERAL_DIRECTORY}")
    assert config["ansible"]["cfg"]["defaults"]["roles_path"] == ""
    # It must not take the lab down: other tests and benchmarks share those hosts.
    assert "destroy" not in config["scenario"]["test_sequence"]
    assert "idempotence" in config["scenario"]["test_sequence"]
