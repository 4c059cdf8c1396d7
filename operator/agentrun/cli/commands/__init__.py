"""One module per area of `kubectl agentrun`; each command is `async def (ctx, args) -> exit code`."""
