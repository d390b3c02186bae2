"""The lab: three local systemd test hosts, and the stand-ins for what only runs on B300 hardware."""
