"""The lab's DCGM exporter stand-in (src/pdctl/lab/fakegpu/dcgm_exporter.py): serves every field of the
counters file it is given, one series per emulated GPU with the real exporter's labels, faults included."""
from __future__ import annotations

import copy
import socket
import subprocess
import sys
import time

import httpx
import pytest

import promql
from pdctl import collection
from pdctl.lab.fakegpu import dcgm_exporter
from pdctl.lab.fakegpu.nvidia_smi import DEFAULT_PROFILE

COUNTERS = (collection.root() / "roles/monitoring/files/dcgm-counters.csv").read_text()


def test_every_field_of_pdctls_counters_file_is_served_for_every_gpu():
    counters = dcgm_exporter.read_counters(COUNTERS)
    text = dcgm_exporter.exposition(counters, copy.deepcopy(DEFAULT_PROFILE), hostname="h")
    assert promql.exposition_names(text) == {f for f, _, _ in counters}
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"} <= {f for f, _, _ in counters}
    xid = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{")]
    assert len(xid) == 8 and 'gpu="0",UUID="GPU-' in xid[0] and 'Hostname="h"' in xid[0] and xid[0].endswith(" 0")


def test_faults_of_the_profile_show_as_counters():
    profile = copy.deepcopy(DEFAULT_PROFILE)
    profile["faults"] = {"ecc_errors": [{"gpu": 6, "volatile_uncorrected": 3}],
                         "nvlink_errors": [{"gpu": 1, "link": 2, "crc": 4}, {"gpu": 1, "link": 5, "crc": 1}],
                         "xid": [{"gpu": 2, "xid": 79}]}
    text = dcgm_exporter.exposition(dcgm_exporter.read_counters(COUNTERS), profile, hostname="h")

    def value(field, gpu):
        (line,) = [x for x in text.splitlines() if x.startswith(field + "{") and 'gpu="%d"' % gpu in x]
        return float(line.rsplit(" ", 1)[1])

    assert value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 6) == 3 and value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 5) == 0
    assert value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1) == 5
    assert value("DCGM_FI_DEV_XID_ERRORS", 2) == 79


def test_a_line_that_is_not_a_field_is_refused():
    with pytest.raises(ValueError, match="line 2"):
        dcgm_exporter.read_counters("# c\nnot_a_field, gauge, x\n")


def test_it_serves_metrics_over_http(tmp_path):
    counters = tmp_path / "c.csv"
    counters.write_text(COUNTERS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pdctl.lab.fakegpu.dcgm_exporter", "-f", str(counters),
                             "-a", "127.0.0.1:%d" % port], stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                resp = httpx.get("http://127.0.0.1:%d/metrics" % port, timeout=5)
                break
            except httpx.TransportError:
                assert time.time() < deadline, "the stand-in did not listen"
                time.sleep(0.2)
        assert resp.status_code == 200
        assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{" in resp.text
    finally:
        proc.terminate()
        proc.wait(10)
