#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_verify
short_description: Check that a served model path shows a verified revision
description:
  - Read-only. By default a fast check (the verified marker matches the manifest and every file's
    size and mtime); with O(full=true) every byte is hashed again on all cores, which also warms the page cache.
  - Fails naming each wrong file with expected and found size or sha256, unless O(fail_on_mismatch=false).
version_added: "0.1.0"
options:
  revision:
    description: Revision the path must show; defaults to whatever it shows now.
    type: str
  full:
    description: Hash every file instead of trusting the marker.
    type: bool
    default: false
  workers:
    description: Files hashed at the same time; 0 means one per CPU core.
    type: int
    default: 0
  fail_on_mismatch:
    description: Fail when the path is absent, at another revision or damaged.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.model_path
attributes:
  check_mode:
    details: Read-only; runs the same in check mode.
"""

EXAMPLES = r"""
- name: Full re-verification (also warms the page cache before vLLM starts)
  pdctl.vllm_pd.model_verify:
    path: /mnt/model/glm/GLM-5.2-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    full: true
"""

RETURN = r"""
verified:
  description: Whether the path shows the revision with every file as the manifest lists it.
  type: bool
  returned: always
  sample: true
checked:
  description: fast (marker), full (hashed), or none (path absent or at another revision).
  type: str
  returned: always
  sample: fast
current_revision:
  description: Revision the served path points at (null when absent).
  type: str
  returned: always
  sample: 0123456789abcdef0123456789abcdef01234567
problems:
  description: One line per wrong file, naming it with expected and found size or digest.
  type: list
  elements: str
  returned: always
  sample: []
manifest_digest:
  description: Digest of the manifest recorded for the revision.
  type: str
  returned: when the revision is current
  sample: 6f7e3373ad6e49130912e9f084c6ff49281ed36f99f396cb853e2684a0b50e43
seconds:
  description: Time the check took.
  type: float
  returned: always
  sample: 0.01
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model import Layout, ModelError, status


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            revision=dict(type="str"),
            full=dict(type="bool", default=False),
            workers=dict(type="int", default=0),
            fail_on_mismatch=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    started = time.monotonic()
    try:
        revision = p["revision"] or Layout(p["path"]).current()
        if revision is None:
            result = {"path": p["path"], "revision": None, "current_revision": None, "verified": False,
                      "checked": "none", "problems": ["%s: absent" % p["path"]]}
        else:
            result = status(p["path"], revision, full=p["full"], workers=p["workers"] or None)
    except ModelError as exc:
        module.fail_json(msg="model_verify %s: %s" % (p["path"], exc), problems=exc.problems)
    result["seconds"] = round(time.monotonic() - started, 3)
    if p["fail_on_mismatch"] and not result["verified"]:
        why = result["problems"] or ["%s shows revision %s, expected %s"
                                     % (p["path"], result["current_revision"], revision)]
        module.fail_json(msg="model_verify %s revision %s: %s" % (p["path"], revision, "; ".join(why)),
                         changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
