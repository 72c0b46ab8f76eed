"""Polling IMDS: its timing, the rate budget shared with approvals, the VM name lookup."""
