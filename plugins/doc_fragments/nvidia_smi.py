# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia-smi a GPU check module runs."""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  nvidia_smi:
    description: Path or name of the nvidia-smi binary.
    type: str
    default: nvidia-smi
"""
