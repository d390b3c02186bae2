"""`pdctl gate accuracy|sla|soak` (``cli``): the rollout gates from the command line.

The gates' logic is the collection's controller-side code, shared with its action plugins
(``pdctl.vllm_pd.accuracy_gate``, ``pdctl.vllm_pd.sla_gate``):
``ansible_collections.pdctl.vllm_pd.plugins.plugin_utils.gates`` - ``datasets``, ``prompts``, ``accuracy``,
``sla``, ``soak``, ``stats``, ``report``, ``answer_key``.
"""
