"""Test-wide settings. The tests import the collection's code the one way everything else does
(`ansible_collections.pdctl.vllm_pd...`, linked by scripts/bootstrap), and their helper modules
through pytest's `pythonpath` setting (pyproject.toml)."""
# Before any test module imports the collection: pdctl puts Ansible's collection loader in place
# (see pdctl._use_ansible_collection_loader).
import pdctl  # noqa: F401
