"""Adapters that make agent frameworks durable on agentrun (optional extras: agentrun-k8s[langgraph])."""
