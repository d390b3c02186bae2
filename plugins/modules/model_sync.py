#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_sync
short_description: Lay out a verified model revision at a served path, atomically
description:
  - Fills a staging directory beside the served path from a source (Hugging Face Hub, an HTTP tree
    such as a fan-out server started by M(pdctl.vllm_pd.model_serve), or a local/NFS mirror directory), resuming
    partial files, hashing every byte while copying, and checking sizes and sha256 against the manifest.
  - Only a fully verified revision is published, by renaming a temporary symlink over O(path),
    so the served path always shows one complete revision.
  - A run where O(path) already shows O(revision) and the verified marker matches (sizes and
    mtimes) reads no file content and reports no change.
  - Writes one line per fill to C(.<name>.versions/transfers.jsonl) with the bytes read from the source,
    and progress to C(.<name>.versions/progress.log).
version_added: "0.1.0"
options:
  path:
    description: Served model path (becomes a symlink to C(.<name>.versions/<revision>)).
    type: path
    required: true
  revision:
    description:
      - Revision to lay out. For a Hub source, the pinned commit id (a branch name is resolved to its commit).
      - For a mirror or HTTP source, must equal the revision recorded in the source's C(.pdctl-manifest.json).
    type: str
    required: true
  source:
    description:
      - C(hf://<org>/<name>) for the Hugging Face Hub, C(http(s)://host:port/prefix/) for an HTTP tree
        that serves C(.pdctl-manifest.json), or a directory path on the host.
    type: str
    required: true
  token:
    description:
      - Bearer token for the source (Hub access token). Never logged or returned.
      - Defaults to the C(HF_TOKEN) environment variable of the module.
    type: str
  hub_endpoint:
    description: Hub base URL (a mirror of the Hub API, or a lab stub).
    type: str
    default: https://huggingface.co
  manifest_digest:
    description: Expected manifest digest (from the seed host); the fill fails when the source lists other content.
    type: str
  disk_margin_pct:
    description: Free space required beyond the bytes to fetch, in percent of them.
    type: int
    default: 10
  jobs:
    description: Files transferred at the same time.
    type: int
    default: 4
  keep_previous:
    description: Older revisions kept under C(.<name>.versions) after a switch (for a quick rollback).
    type: int
    default: 1
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
attributes:
  check_mode:
    details: Reports what would be fetched (files, bytes) and whether the layout would switch; writes nothing.
  diff_mode:
    support: full
    details: Shows the revision the served path points at before and after.
notes:
  - Staging lives on the same filesystem as the served path, so the switch is a rename.
  - For an HTTP source in check mode the source is not contacted (a fan-out server only runs for real).
"""

EXAMPLES = r"""
- name: Stage GLM-5.2-NVFP4 from the Hub on the seed host
  pdctl.vllm_pd.model_sync:
    path: /mnt/model/glm/GLM-5.2-NVFP4
    source: hf://nvidia/GLM-5.2-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    token: "{{ hf_token }}"
  no_log: true

- name: Fill from the seed host's fan-out server
  pdctl.vllm_pd.model_sync:
    path: /mnt/model/glm/GLM-5.2-NVFP4
    source: "http://10.0.0.11:{{ pdctl_ports.model_fanout }}/"
    revision: 0123456789abcdef0123456789abcdef01234567
    manifest_digest: "{{ seed_result.manifest_digest }}"
"""

RETURN = r"""
path:
  description: Served path.
  type: str
  returned: always
  sample: /mnt/model/glm/GLM-5.2-NVFP4
revision:
  description: Revision laid out (a Hub branch name resolved to its commit).
  type: str
  returned: always
  sample: 0123456789abcdef0123456789abcdef01234567
previous_revision:
  description: Revision the served path pointed at before the run (null when absent).
  type: str
  returned: always
  sample: null
action:
  description: current (nothing to do), filled, switched (revision was already staged), repaired, or would_* in check mode.
  type: str
  returned: always
  sample: filled
bytes_from_source:
  description: Bytes read from the source in this run.
  type: int
  returned: always
  sample: 451234567890
bytes_to_fetch:
  description: Bytes the fill needed after partial files and reusable files of the current version.
  type: int
  returned: when a fill was planned
  sample: 451234567890
files_to_fetch:
  description: Files (relative paths) that needed bytes from the source.
  type: list
  elements: str
  returned: when a fill or repair was planned
  sample: [model-00001-of-00083.safetensors]
manifest_digest:
  description: sha256 over the revision and every path/size/sha256; equal on every host with the same content.
  type: str
  returned: success
  sample: 6f7e3373ad6e49130912e9f084c6ff49281ed36f99f396cb853e2684a0b50e43
size:
  description: Total model size in bytes.
  type: int
  returned: success
  sample: 451234567890
source:
  description: Source as logged (no credentials, no query string).
  type: str
  returned: when the source was consulted
  sample: hf://nvidia/GLM-5.2-NVFP4@0123456789abcdef0123456789abcdef01234567
problems:
  description: One line per wrong file, naming it with expected and found size or digest.
  type: list
  elements: str
  returned: on failure, or when a repair was needed
  sample: ["model-00002-of-00083.safetensors: sha256 expected 3a..., found 9c..."]
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model import Layout, ModelError, prune, sync


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            revision=dict(type="str", required=True),
            source=dict(type="str", required=True),
            token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
            hub_endpoint=dict(type="str", default="https://huggingface.co"),
            manifest_digest=dict(type="str"),
            disk_margin_pct=dict(type="int", default=10),
            jobs=dict(type="int", default=4),
            keep_previous=dict(type="int", default=1),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    lay = Layout(p["path"])

    def emit(line):
        # Long fills: `tail -f .<name>.versions/progress.log` on the host shows where they are.
        with open(lay.progress_log, "a") as fh:
            fh.write(line + "\n")

    try:
        result = sync(p["path"], p["source"], p["revision"], token=p["token"], hub_endpoint=p["hub_endpoint"],
                      check_mode=module.check_mode, expected_digest=p["manifest_digest"],
                      margin_pct=p["disk_margin_pct"], jobs=p["jobs"], emit=None if module.check_mode else emit)
        if result["changed"] and not module.check_mode:
            result["pruned"] = prune(p["path"], keep=p["keep_previous"])
    except ModelError as exc:
        module.fail_json(msg="model_sync %s revision %s: %s" % (p["path"], p["revision"], exc),
                         problems=exc.problems, path=p["path"], revision=p["revision"])
    except OSError as exc:
        module.fail_json(msg="model_sync %s revision %s: %s" % (p["path"], p["revision"], exc),
                         path=p["path"], revision=p["revision"], exception=traceback.format_exc())
    if result["changed"]:
        result["diff"] = {"before": "revision: %s\n" % result["previous_revision"],
                          "after": "revision: %s\n" % result["revision"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
