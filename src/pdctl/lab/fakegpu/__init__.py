"""Lab GPU emulator: a stand-in `nvidia-smi` for test hosts without GPUs (see docs/hardware-profile.md)."""
