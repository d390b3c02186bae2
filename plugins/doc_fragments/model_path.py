# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The served model path a model module reads, as model_sync lays it out."""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  path:
    description: Served model path laid out by M(pdctl.vllm_pd.model_sync).
    type: path
    required: true
"""
