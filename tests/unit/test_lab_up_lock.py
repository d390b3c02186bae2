"""Two `pdctl-lab up` at once (molecule's create beside the lab tests' own fixture) take turns: they
share the image, the network, the store and the staged files."""
import threading
import time

from pdctl.lab import hosts


def test_two_bring_ups_at_once_take_turns(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "lab_dir", lambda: tmp_path)
    inside, overlaps, order = [0], [], []
    guard = threading.Lock()

    def fake_up(inventory_dir):
        with guard:
            inside[0] += 1
            overlaps.append(inside[0])
            order.append(("start", inventory_dir))
        time.sleep(0.3)
        with guard:
            inside[0] -= 1
            order.append(("end", inventory_dir))
        return 0

    monkeypatch.setattr(hosts, "_up", fake_up)
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(hosts.up(n))) for n in ("lab", "molecule")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 0]
    assert max(overlaps) == 1, "two bring-ups ran at the same time: %s" % order
    assert [kind for kind, _ in order] == ["start", "end", "start", "end"], order
