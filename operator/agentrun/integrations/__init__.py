"""Adapters that make agent frameworks durable on agentrun (optional extras: agentrun[langgraph])."""
