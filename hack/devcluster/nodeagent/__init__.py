"""The process-backed node agent: the one stand-in for a real component.

It plays the kubelet for one Node: registers it, keeps it Ready through a heartbeat Lease, and runs
every Pod bound to it as local processes (no images: commands run in the project's Python
environment), reporting Pod status, exit codes and termination messages as a kubelet would.
"""
