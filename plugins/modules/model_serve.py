#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_serve
short_description: One-shot HTTP server of a verified model revision, for host-to-host fan-out
description:
  - Serves the files of the verified current revision of O(path) (and its C(.pdctl-manifest.json)),
    with HTTP Range so receivers resume, until a C(POST /.pdctl/shutdown/<nonce>), O(idle_timeout)
    seconds without requests, or O(max_seconds).
  - Meant to run with C(async) and C(poll=0) on the seed host while the other hosts run M(pdctl.vllm_pd.model_sync)
    against it. Receivers verify every byte against the manifest, so the transport needs no integrity of its own.
  - Nothing but the manifest's files is reachable. Refuses to start unless the revision is verified.
version_added: "0.1.0"
options:
  revision:
    description: Revision to serve; must be the verified current one.
    type: str
    required: true
  bind:
    description: Address to listen on.
    type: str
    default: 0.0.0.0
  port:
    description: TCP port; the playbooks pass the planned one, C(pdctl_ports.model_fanout).
    type: int
    required: true
  idle_timeout:
    description: Seconds without a request (and no transfer running) after which the server stops.
    type: int
    default: 300
  max_seconds:
    description: Hard limit on the server's lifetime.
    type: int
    default: 86400
  nonce:
    description: Secret part of the shutdown URL.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - pdctl.vllm_pd.attributes
  - pdctl.vllm_pd.model_path
attributes:
  check_mode:
    details: In check mode the server is not started (nothing would change either way).
"""

EXAMPLES = r"""
- name: Serve the staged model to the other hosts
  pdctl.vllm_pd.model_serve:
    path: /mnt/model/glm/GLM-5.2-NVFP4
    revision: 0123456789abcdef0123456789abcdef01234567
    bind: 10.0.0.11
    port: "{{ pdctl_ports.model_fanout }}"
    nonce: "{{ fanout_nonce }}"
  async: 86400
  poll: 0
"""

RETURN = r"""
bytes_sent:
  description: Bytes of model files sent to receivers.
  type: int
  returned: success
  sample: 902469135780
stopped:
  description: Why the server stopped (shutdown, idle, max_seconds), or not_started in check mode.
  type: str
  returned: always
  sample: shutdown
manifest_digest:
  description: Digest of the manifest served.
  type: str
  returned: success
  sample: 6f7e3373ad6e49130912e9f084c6ff49281ed36f99f396cb853e2684a0b50e43
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model import ModelError, serve


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            revision=dict(type="str", required=True),
            bind=dict(type="str", default="0.0.0.0"),
            port=dict(type="int", required=True),
            idle_timeout=dict(type="int", default=300),
            max_seconds=dict(type="int", default=86400),
            nonce=dict(type="str", no_log=True),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, stopped="not_started")
    try:
        result = serve(p["path"], p["revision"], bind=p["bind"], port=p["port"], idle_timeout=p["idle_timeout"],
                       max_seconds=p["max_seconds"], nonce=p["nonce"])
    except (ModelError, OSError) as exc:
        module.fail_json(msg="model_serve %s revision %s on %s:%d: %s" % (p["path"], p["revision"], p["bind"], p["port"], exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
