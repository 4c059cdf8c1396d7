"""`kubectl agentrun console`: a web inbox for the requests that wait for a person, run as that person."""
