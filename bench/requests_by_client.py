"""Who sends the API requests of a throughput batch of Runs: the batch of bench/throughput.py (instant node
agent, echo Runs), on a control plane with an audit log, broken down by client (user agent and user),
verb and resource; counted over the batch's own window (as `make bench` counts) and until the operator
has nothing left to do for the batch (compaction, Pod collection: work done after the last Run ended).

    PYTHONPATH=hack:tests .venv/bin/python bench/requests_by_client.py --n 300
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import throughput
from harness import Bench, by_verb_resource, request_delta

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: None
  verbs: [watch]
- level: Metadata
"""
VERBS = {
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
    "get": "GET",
    "list": "LIST",
}


def client_of(event: dict[str, object]) -> str:
    agent = str(event.get("userAgent") or "-").split(" ")[0].split("/")[0]
    user = str((event.get("user") or {}).get("username", "-"))  # type: ignore[attr-defined]
    if user.startswith("system:serviceaccount:tp-"):
        user = "attempt ServiceAccount"
    return f"{agent} ({user})"


def audited(path: Path, since: str, until: str) -> Counter[tuple[str, str, str]]:
    """(client, verb, resource) of the requests completed between two audit timestamps (the response code
    after the resource unless 2xx)."""
    out: Counter[tuple[str, str, str]] = Counter()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        stamp = event.get("stageTimestamp", "")
        if not since <= stamp < until or event.get("verb") == "watch":
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "-") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        verb = VERBS.get(event["verb"], event["verb"].upper())
        code = str((event.get("responseStatus") or {}).get("code", "-"))
        if not code.startswith("2"):
            resource += f" ({code})"
        out[(client_of(event), verb, resource)] += 1
    return out


def utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000Z"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the batch for late work")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrun-reqs-") as tmp:
        state = Path(tmp)
        policy, audit = state / "audit-policy.yaml", state / "audit.log"
        policy.write_text(AUDIT_POLICY)
        bench = Bench(
            state,
            instant=True,
            apiserver_flags=[
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit}",
                "--audit-log-maxsize=0",
            ],
        )
        try:
            bench.start()
            ns = bench.namespace("tp-runs-0")
            began = utc()
            batch = throughput.batch(bench, "runs", ns, args.n, timeout=1200)
            ended = utc()
            before = bench.requests()
            time.sleep(args.settle)  # the work done for the batch after its window: compaction, podGC
            late = by_verb_resource(request_delta(bench.requests(), before))
            settled = utc()
        finally:
            bench.stop()
        n = args.n
        print(f"\n## window (as make bench counts): {sum(batch.requests.values()) / n:.2f} per Run")
        for (verb, resource), count in batch.requests.most_common():
            print(f"| {verb} {resource} | {count / n:.2f} |")
        print(f"\n## after the window ({args.settle:.0f} s): {sum(late.values()) / n:.2f} per Run")
        for (verb, resource), count in late.most_common():
            print(f"| {verb} {resource} | {count / n:.2f} |")
        for title, since, until in (("window", began, ended), ("after", ended, settled)):
            print(f"\n## by client, {title} (audit log)")
            for (who, verb, resource), count in sorted(audited(audit, since, until).items()):
                print(f"| {who} | {verb} {resource} | {count / n:.3f} |")


if __name__ == "__main__":
    main()
