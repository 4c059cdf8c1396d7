"""Where text goes: results to stdout (tables, or the raw objects with -o json|yaml), notes to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")


def without_managed_fields(body: Any) -> Any:
    """The object (or each item of a List) without metadata.managedFields, as `kubectl get` prints it:
    the server's bookkeeping of who set which field, long and rarely wanted. Nothing else changes."""
    if not isinstance(body, dict):
        return body
    shown = dict(body)
    metadata = shown.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        shown["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    if isinstance(shown.get("items"), list):
        shown["items"] = [without_managed_fields(item) for item in shown["items"]]
    return shown


def as_list(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several objects as one document, like `kubectl get -o json` prints them."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {}}


class Output:
    def __init__(
        self,
        fmt: str = "table",
        out: TextIO | None = None,
        err: TextIO | None = None,
        *,
        managed_fields: bool = False,
    ) -> None:
        self.format = fmt
        self.managed_fields = managed_fields
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._documents = 0

    @property
    def raw(self) -> bool:
        """Whether the user asked for the objects themselves (-o json or -o yaml) instead of text."""
        return self.format != "table"

    def text(self, text: str) -> None:
        """Text for people: on stdout in table mode, on stderr when stdout carries objects."""
        print(text, file=self.err if self.raw else self.out, flush=True)

    def note(self, text: str) -> None:
        """A remark beside the result (nothing found, what to do next): always stderr."""
        print(text, file=self.err, flush=True)

    def obj(self, body: Any) -> None:
        """One raw object (or List) in the chosen format, without managedFields unless asked for; in
        table mode, nothing."""
        if not self.managed_fields:
            body = without_managed_fields(body)
        if self.format == "json":
            print(json.dumps(body, indent=2, ensure_ascii=False), file=self.out, flush=True)
        elif self.format == "yaml":
            if self._documents:
                print("---", file=self.out)
            print(
                yaml.safe_dump(body, sort_keys=False, allow_unicode=True).rstrip(), file=self.out, flush=True
            )
        self._documents += 1
