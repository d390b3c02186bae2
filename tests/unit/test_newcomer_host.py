# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 36 acceptance 1: a newcomer adds a prefill host to production with ONE line in hosts.yml, and the plan
and every rendered file follow (routers, firewall, scrape targets). Expectations are computed from the
production inventory's own plan, so this holds for whatever inventories/b300 holds today."""
from __future__ import annotations

import difflib
import shutil

import pytest

from inventories import PRODUCTION
from pdctl import cli, inventory

# TEST-NET-1 addresses production does not use (its hosts are 192.0.2.10-13).
NEW_ADDRESSES = ("192.0.2.41", "192.0.2.42")


def with_prefill_hosts(dest, count):
    """A copy of inventories/b300 with `count` more prefill hosts, each added as one line of hosts.yml, right
    after the last prefill host (as an operator would). Returns (path, [(name, address)])."""
    shutil.copytree(PRODUCTION, dest, symlinks=False)
    before = (dest / "hosts.yml").read_text().splitlines(keepends=True)
    existing = [h for h in inventory.plan(PRODUCTION)["hosts"] if h.startswith("b300-prefill-")]
    added = [("b300-prefill-%d" % (len(existing) + i), NEW_ADDRESSES[i]) for i in range(count)]
    at = before.index("        decode:\n")  # the prefill group's hosts end where the decode group starts
    after = before[:at] + ["            %s: {ansible_host: %s}\n" % host for host in added] + before[at:]
    (dest / "hosts.yml").write_text("".join(after))
    changed = [d for d in difflib.unified_diff(before, after, n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    assert len(changed) == count and all(d.startswith("+") for d in changed), changed  # one line per host
    return dest, added


@pytest.mark.parametrize("count", [1, 2])
def test_a_prefill_host_is_one_line_and_the_plan_takes_it(tmp_path, count, capsys):
    path, added = with_prefill_hosts(tmp_path / "inv", count)
    assert cli.main(["plan", "-i", str(path)]) == 0, capsys.readouterr()
    base, plan = inventory.plan(PRODUCTION), inventory.plan(path)
    model = [i for i in base["instances"] if i["host"] == "b300-prefill-0"]  # a prefill host's instances
    for host, address in added:
        mine = [i for i in plan["instances"] if i["host"] == host]
        # The same instances on the same GPUs and ports as any prefill host, on its own address.
        assert [(i["pool"], i["gpus"], i["api_port"]) for i in mine] == [
            (i["pool"], i["gpus"], i["api_port"]) for i in model]
        assert {i["address"] for i in mine} == {address}
        for router in plan["routers"]:
            assert {i["url"] for i in mine} <= set(router["prefill_urls"]), router["host"]
    assert len(plan["instances"]) == len(base["instances"]) + count * len(model)
    assert len({i["name"] for i in plan["instances"]}) == len(plan["instances"])
    # Nothing else moves: every instance production already has keeps its name, GPUs and ports.
    keep = {i["name"]: (i["host"], i["gpus"], i["api_port"]) for i in base["instances"]}
    assert {i["name"]: (i["host"], i["gpus"], i["api_port"]) for i in plan["instances"] if i["name"] in keep} == keep


def test_a_fourth_host_is_rendered_and_every_peer_admits_it(tmp_path):
    path, [(host, address)] = with_prefill_hosts(tmp_path / "inv", 1)
    out = tmp_path / "out"
    assert cli.main(["render", "-i", str(path), "--out", str(out)]) == 0
    plan = inventory.plan(path)
    for instance in (i for i in plan["instances"] if i["host"] == host):
        assert (out / host / ("etc/systemd/system/pdctl-vllm-%s.service" % instance["name"])).is_file()
        assert (out / host / ("etc/pdctl/%s.env" % instance["name"])).is_file()
    assert (out / host / "etc/nftables.conf").is_file()
    # Every other host's firewall admits it (NIXL side channels, the model fan-out), every router sends to it.
    for other in plan["hosts"]:
        if other != host:
            assert address in (out / other / "etc/nftables.conf").read_text(), other
    for router in plan["routers"]:
        assert address in (out / router["host"] / "etc/systemd/system/pdctl-router.service").read_text()
