"""pdctl: operator commands for the P/D vLLM deployment (plan, render, lab, gates)."""
