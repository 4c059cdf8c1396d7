"""Runnable example agents (python -m agentrun.examples.<name>), used by the demo and the tests."""
