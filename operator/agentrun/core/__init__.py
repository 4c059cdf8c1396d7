"""Pure decisions: phase transitions, retry policy, failure classes, fences and ledger rules.

Everything here is a plain function of (objects, now) that returns intended writes; nothing here does
I/O. An import-linter contract (pyproject.toml) keeps it that way.
"""
