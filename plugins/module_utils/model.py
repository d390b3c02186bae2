# -*- coding: utf-8 -*-
# Copyright: pdctl contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights: the operations the model_* modules run, over the modules that implement them.

Pure standard library, used by plugins/modules/model_*.py on the hosts and by the pdctl CLI.

  model_manifest   ModelError, the manifest (path/size/sha256 per file), its digest and JSON files
  model_hashing    parallel sha256, progress lines, verification of a tree, the verified marker
  model_layout     the served path's versions dir, status, atomic switch, prune
  model_sources    mirror directory, HTTP(S) tree, Hugging Face Hub
  model_fill       sync: plan, disk preflight, resumable fill hashed while copying, publish, repair
  model_fanout     the one-shot HTTP server a seed host runs for the others

Callers that need a building block (a manifest, a hash) import it from its own module.
"""
from __future__ import annotations

from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_fanout import serve
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_fill import sync
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_layout import Layout, prune, status
from ansible_collections.pdctl.vllm_pd.plugins.module_utils.model_manifest import ModelError

__all__ = ["Layout", "ModelError", "prune", "serve", "status", "sync"]
