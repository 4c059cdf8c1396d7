"""python -m agentrun.operator [--namespace NS ...] [--log-format json]: run the operator (cluster-wide by
default). Prometheus metrics are served on $AGENTRUN_METRICS_PORT (default 8000; 0: off)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random

import kopf
import uvloop

from agentrun.api import ApiModel
from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import KubeApi
from agentrun.operator import bootstrap, handlers, logs, policies, store_credentials
from agentrun.operator.peering import replica_identity
from agentrun.operator.settings import OperatorSettings, auto_priority, own_account

log = logging.getLogger("agentrun.operator")


def freeze_startup_objects() -> None:
    """Takes what the process holds now (kopf, pydantic's schemas, the kubernetes client: most of its
    objects, all of them as long-lived as the process) out of the garbage collector's generations, after
    collecting what is already garbage. Each full collection then scans only what the operator built
    since; rescanning these was about a tenth of its CPU per Run (bench/findings.md, "Cost per Run").
    The models' validators (built on first use, for the SDK's start) are built first, to be among them."""
    ApiModel.build_models()
    gc.collect()
    gc.freeze()


async def require_policies(api: KubeApi, clock: Clock) -> None:
    """Exits (code 2, the reason logged) when the admission policies are not installed for this operator."""
    if not policies.required(os.environ):
        log.warning(
            "%s=false: not checking the admission policies; attempt Pods are not fenced by the API server",
            policies.REQUIRE_ENV,
        )
        return
    try:
        await policies.require(api, own_account(), clock, within=policies.wait_seconds(os.environ))
    except policies.PoliciesMissing as missing:
        log.error("%s", missing)
        raise SystemExit(2) from None


# How long the operator waits at its start for the bundled state store to answer (its StatefulSet is
# installed with it), before it exits and is restarted.
BUNDLED_STORE_WAIT_ENV = "AGENTRUN_STATE_STORE_WAIT_SECONDS"


async def require_bundled_bucket(config: OperatorSettings, clock: Clock) -> None:
    """With the bundled state store (AGENTRUN_STATE_STORE_PROVISION): its bucket exists, versioned, or the
    operator exits (code 2, the reason logged)."""
    try:
        bundled = store_credentials.bundled_store(config)
    except ValueError as error:  # told to provision without the server's root credentials
        log.error("%s", error)
        raise SystemExit(2) from None
    if bundled is None:
        return
    within = float(os.environ.get(BUNDLED_STORE_WAIT_ENV) or 120)
    try:
        await store_credentials.prepare_bucket(bundled, clock, within=within)
    except store_credentials.BucketNotReady as error:
        log.error("%s", error)
        raise SystemExit(2) from None


async def run(namespaces: list[str], liveness: str | None) -> None:
    clock = SystemClock()  # the operator's one clock: every collaborator is given it
    chance = random.Random()
    config = OperatorSettings.from_env(auto_priority(clock, chance))
    identity = replica_identity(os.environ, clock, chance)
    api = KubeApi(threads=2)
    try:
        await bootstrap.prepare(api, namespaces, config.peering, clock)
        await require_policies(api, clock)
        await require_bundled_bucket(config, clock)
    finally:
        await api.aclose()  # else its session is reported unclosed ("ERROR asyncio") at every start
    level, said = config.state_store_said()
    log.log(level, "%s", said)
    freeze_startup_objects()
    settings = kopf.OperatorSettings()
    # Namespace-scoped mode runs without cluster-wide permissions: kopf need not (and cannot) list
    # namespaces or watch CRDs; the API was found served above.
    settings.scanning.disabled = bool(namespaces)
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
        settings=settings,
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str, not exported
        registry=handlers.registry(namespaces, config, clock, identity),
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrun.operator", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=os.environ.get("AGENTRUN_LIVENESS_ENDPOINT") or None,
        help="serve kopf's health endpoint for probes, e.g. http://0.0.0.0:8080/healthz "
        "(default: $AGENTRUN_LIVENESS_ENDPOINT, else none)",
    )
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("AGENTRUN_LOG_FORMAT") or "text",
        help="text for people, json for log pipelines: one object per line with run/namespace/attempt "
        "fields (default: $AGENTRUN_LOG_FORMAT, else text)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.log_format not in logs.FORMATS:  # argparse checks choices on the command line only
        parser.error(f"AGENTRUN_LOG_FORMAT={args.log_format!r}: choose from {', '.join(logs.FORMATS)}")
    logs.configure(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    logging.getLogger("kubernetes").setLevel(logging.INFO)  # its DEBUG logs every response body
    if not args.verbose:
        # kopf logs "Handler ... succeeded" for every watch event: at scale that is most of the log.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # uvloop: the event loop, its sockets and TLS in C (kopf's own CLI picks it too); asyncio's pure
    # Python transports were a fifth of the operator's CPU per Run (bench/findings.md, "Cost per Run").
    uvloop.run(run(list(args.namespace), args.liveness))


if __name__ == "__main__":
    main()
