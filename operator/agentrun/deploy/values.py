"""The Helm chart's values: one pydantic model, the single source of charts/agentrun/values.yaml (its
defaults and comments) and of values.schema.json (every object closed with additionalProperties: false,
except the Kubernetes objects passed through as they are: resources, securityContext, affinity, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrun.statestore import versitygw

# Kubernetes API objects the chart copies into the Pod spec unchanged (the API server validates them).
KubeObject = dict[str, Any]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class _Values(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True
    )


class Image(_Values):
    repository: str = Field("agentrun/operator", min_length=1)
    """Operator image (built from the repository's Dockerfile)."""
    tag: str = ""
    """Image tag; empty means the chart's appVersion."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy of the operator (and of the `helm test` Pod, which uses the same image)."""


class Crds(_Values):
    install: bool | None = None
    """Install and upgrade the agentrun.dev CRDs with the release; null (default): in cluster-wide mode
    only, so a namespace-scoped release renders nothing cluster-scoped unless asked (a cluster
    administrator installs the CRDs once: manifests/crds/). They are templates (not crds/, which Helm
    never upgrades) annotated helm.sh/resource-policy: keep, so `helm uninstall` never deletes them, nor
    the Runs they hold. Set false when CRDs are managed outside this release (see README)."""


class Admission(_Values):
    install: bool | None = None
    """Install the ValidatingAdmissionPolicies that fence attempt Pods (docs/security.md), bound and
    exempting this release's operator ServiceAccount, with a ClusterRole that lets the operator read
    them by name; null (default): in cluster-wide mode only. They are cluster-scoped: for a
    namespace-scoped release a cluster administrator installs them once, rendering this chart with the
    release's values and admission.install=true (--show-only templates/admission.yaml). The operator
    refuses to start while they are missing."""


class ApiPriority(_Values):
    install: bool | None = None
    """Install API Priority and Fairness objects (docs/performance.md, "API priorities"): a priority
    level for the operator and Lease renewals, another for what attempt Pods write, and the FlowSchemas
    that send them there, apart from other tenants' workload-low; null (default): in cluster-wide mode
    only. They are cluster-scoped: for a namespace-scoped release a cluster administrator installs them,
    rendering this chart with the release's values and apiPriority.install=true."""


class Peering(_Values):
    enabled: bool = True
    """Run the replicas as kopf peers: one active, the others paused until it goes. Required when
    replicaCount > 1. The operator creates the peering object (KopfPeering in each watched namespace, or a
    ClusterKopfPeering) when it is missing."""
    name: str = Field("agentrun", pattern=NAME_PATTERN, max_length=63)
    """Name of the peering object: operators sharing it see each other."""
    lifetime_seconds: int = Field(15, ge=5, le=600)
    """A replica that dies without saying goodbye is taken over this long after its last heartbeat (a
    replica that stops gracefully hands over at once)."""
    install_crds: bool | None = None
    """Install kopf's peering CRDs (clusterkopfpeerings.kopf.dev, kopfpeerings.kopf.dev); null (default):
    in cluster-wide mode only (cluster-scoped objects). Set false if another kopf-based operator in the
    cluster already installed them."""


class Health(_Values):
    enabled: bool = True
    """Serve kopf's health endpoint (/healthz) and probe it (liveness and readiness)."""
    port: int = Field(8080, ge=1024, le=65535)
    """Container port of the health endpoint. On a local cluster whose Pods share the host's network
    (the process node of `make cluster`), give each release ports of its own and set listenAddress."""


class ServiceMonitor(_Values):
    enabled: bool = False
    """Create a ServiceMonitor (monitoring.coreos.com/v1, the Prometheus Operator's CRD, which must be
    installed) that scrapes the metrics Service."""
    interval: str = Field("30s", pattern=r"^([0-9]+(ms|s|m|h))+$")
    """How often Prometheus scrapes the operator."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels of the ServiceMonitor, e.g. the one your Prometheus selects ServiceMonitors by."""


class Metrics(_Values):
    enabled: bool = True
    """Serve Prometheus metrics (agentrun_*: Runs by phase, Attempts, reconcile latency, lease takeovers,
    rejected commits, side effects) on /metrics, with a Service <fullname>-metrics (port `metrics`,
    annotated prometheus.io/scrape) in front of the operator Pods. Every replica serves its own; only
    the active one counts Runs and Attempts."""
    port: int = Field(8000, ge=1024, le=65535)
    """Container port of the metrics endpoint (AGENTRUN_METRICS_PORT), and the Service's port."""
    service_monitor: ServiceMonitor = Field(default_factory=ServiceMonitor)
    """A Prometheus Operator ServiceMonitor for the metrics Service."""


class OperatorTuning(_Values):
    workers: int = Field(8, ge=1, le=256)
    """Runs reconciled concurrently (AGENTRUN_WORKERS)."""
    event_workers: int = Field(200, ge=1, le=10000)
    """Cap of kopf's per-object watch-event workers (AGENTRUN_EVENT_WORKERS)."""
    watch_timeout_seconds: int = Field(300, ge=30, le=3600)
    """Re-list after this long even if a watch looks healthy (AGENTRUN_WATCH_TIMEOUT_SECONDS)."""
    ttl_seconds_after_finished: int | None = Field(None, ge=-1)
    """A finished Run's time to live when its spec.ttlSecondsAfterFinished is unset: then the operator
    archives it to the state store and deletes it (AGENTRUN_TTL_SECONDS_AFTER_FINISHED). null (default)
    or -1: kept."""
    archive_retention_seconds: int | None = Field(None, ge=0)
    """How long archives of deleted Runs stay in the state store, at least (a day more at most)
    (AGENTRUN_ARCHIVE_RETENTION_SECONDS). null (default): kept."""
    verbose: bool = False
    """Debug logging."""
    extra_env: list[KubeObject] = Field(default_factory=list)
    """More environment variables for the operator container (Kubernetes EnvVar objects)."""


class ServiceAccount(_Values):
    create: bool = True
    """Create the operator's ServiceAccount."""
    name: str = Field("", max_length=253)
    """Its name; empty means the release's full name."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the ServiceAccount (e.g. for workload identity)."""


class AgentServiceAccount(_Values):
    create: bool = True
    """Create the agents' ServiceAccount in every agent namespace, labelled agentrun.dev/agent=true (the
    operator runs attempt Pods only as ServiceAccounts so labelled; label one you bring yourself)."""
    name: str = Field("agentrun-agent", pattern=NAME_PATTERN, max_length=253)
    """The ServiceAccount attempt Pods run as: set spec.agent.serviceAccountName of your Runs to it. It
    is bound to the attempt role (its Run's status, Leases, Checkpoints, SideEffects; nothing else)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the ServiceAccount."""


class Agents(_Values):
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces where attempt Pods run: each gets the agents' ServiceAccount and a binding of the
    attempt role. Empty means the watched namespaces (namespace-scoped mode) or the release namespace
    (cluster-wide mode). In cluster-wide mode, bind the ClusterRole <fullname>-attempt in any other
    namespace with a RoleBinding."""
    service_account: AgentServiceAccount = Field(default_factory=AgentServiceAccount)
    """The agents' ServiceAccount."""


class Rbac(_Values):
    create: bool = True
    """Create the operator's and the agents' RBAC (ClusterRole or Roles, and their bindings)."""


class PodDisruptionBudget(_Values):
    enabled: bool = True
    """Create a PodDisruptionBudget when replicaCount > 1."""
    max_unavailable: int = Field(1, ge=1)
    """How many operator replicas a voluntary disruption (a node drain) may take down at once."""


class BundledImage(_Values):
    repository: str = Field(versitygw.IMAGE, min_length=1)
    """The versitygw image (upstream's)."""
    tag: str = Field(versitygw.VERSION, min_length=1)
    """Its tag: the version the local control plane builds and the tests run (hack/build-versitygw.sh)."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy of the server."""


class BundledStorage(_Values):
    size: str = Field("10Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    """Size of the server's PersistentVolumeClaim (its buckets, object versions and users). Versioning keeps
    every deleted blob's earlier version: leave room (docs/state-store.md, "Collection")."""
    storage_class_name: str | None = Field(None, max_length=253)
    """StorageClass of the claim; null (default): the cluster's default StorageClass; "": no class (a
    PersistentVolume made by hand)."""


class BundledStore(_Values):
    enabled: bool = True
    """Install the state store with the release (the default): versitygw (an S3-compatible server, one
    replica) as a StatefulSet with its data on a PersistentVolumeClaim, a Service <fullname>-store, and the
    operator pointed at it with the server's root credentials. The operator creates the bucket with
    versioning on at its start, and each opted-in agent namespace's principals and Secrets
    (stateStore.agentSecretName). One replica, one volume: back the volume up. stateStore.url may name
    another address of the same server (default: the Service's); stateStore.credentialsSecret must be
    empty (the operator's credentials are the server's root). A store of your own: set stateStore.url,
    stateStore.credentialsSecret and enabled=false. Without a URL and with enabled=false the operator keeps
    agent state inline within the byte budgets and never archives a finished Run: a choice it reports."""
    install: bool = True
    """Render the server itself (StatefulSet, claim, Service, and the root Secret unless existingSecret).
    false: the server runs elsewhere, stateStore.url names it and existingSecret holds its root
    credentials (the local control plane's object store: `make cluster` writes these values)."""
    existing_secret: str = Field("", pattern=r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)
    """A Secret in the release's namespace holding the server's root credentials as AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY. Empty (default): the chart makes <fullname>-store-root with random ones, kept
    across upgrades."""
    image: BundledImage = Field(default_factory=BundledImage)
    """The server's image."""
    bucket: str = Field(versitygw.BUCKET, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """The bucket the operator creates (versioned) and the store URL names."""
    port: int = Field(versitygw.PORT, ge=1024, le=65535)
    """The server's port (container and Service)."""
    storage: BundledStorage = Field(default_factory=BundledStorage)
    """The server's volume."""
    resources: KubeObject = Field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    )
    """Resources of the server's container."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector of the server's Pod."""
    tolerations: list[KubeObject] = Field(default_factory=list)
    """Tolerations of the server's Pod."""
    read_namespaces: bool = False
    """Namespace-scoped mode only: a ClusterRole <fullname>-namespaces, bound to the operator, that lets it
    get each watched namespace by name (nothing else), so that its sweep of the server's principals sees
    a namespace deleted and takes that namespace's principals back. Cluster-scoped, so off unless asked;
    without it the sweep cannot read the namespaces (it logs so), namespaces still get their principals
    before their first Run, and those of a deleted namespace stay on the server. Cluster-wide mode needs
    nothing more."""


class StateStore(_Values):
    url: str = Field("", max_length=2048, pattern=r"^$|^(s3|gs|az|file)://[^@\s]+$")
    """The agent-state store's URL (docs/state-store.md), e.g. s3://bucket/prefix?endpoint=https://...;
    empty (default): the bundled server's Service (bundled.enabled, the default), else no store (all state
    stays inline within the byte budgets, which the operator reports). A URL never holds credentials (the
    schema and the operator refuse one with '@')."""
    credentials_secret: str = Field("", pattern=r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)
    """A Secret in the release's namespace whose keys become the operator's environment (e.g.
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY): the operator's own store principal, the one allowed to
    delete (the collector, compaction, archives). Empty: the operator's environment gives them some other
    way (workload identity, operator.extraEnv)."""
    agent_secret_name: str = Field("agentrun-state-store", pattern=NAME_PATTERN, max_length=253)
    """The Secret, in each agent namespace, holding that namespace's own store credentials (get and put
    under its prefix, no delete); attempt Pods take them by secretKeyRef. A Run whose namespace lacks it
    fails before its first Attempt (StateStoreCredentialsMissing)."""
    bundled: BundledStore = Field(default_factory=BundledStore)
    """The state store installed with the release (on by default; with a store of your own set url,
    credentialsSecret and bundled.enabled=false)."""


class ConsoleService(_Values):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """Type of the console's Service: ClusterIP (default) for the proxy in front of it."""
    port: int = Field(80, ge=1, le=65535)
    """Port of the console's Service (to the console container's port)."""


class Console(_Values):
    enabled: bool = False
    """Run `kubectl agentrun console` in the cluster (a Deployment and a Service <fullname>-console)
    behind an authenticating (OIDC) proxy that the administrator puts in front of it, e.g.
    oauth2-proxy with --pass-access-token. Every request must carry the person's bearer token, and the
    console reads and writes with that token alone: the API server's RBAC decides what each person sees
    and may do, and records who they are. A request without a token is refused. The console's own
    ServiceAccount is bound to nothing: it only tells the console where the API server is. The API
    server must accept the proxy's tokens (its OIDC authentication configured for the same issuer)."""
    token_header: str = Field("X-Forwarded-Access-Token", pattern=r"^[A-Za-z0-9-]+$", max_length=128)
    """The request header the proxy puts the person's token in: X-Forwarded-Access-Token (oauth2-proxy's
    --pass-access-token), or Authorization (`Bearer <token>`, e.g. --pass-authorization-header)."""
    hosts: list[str] = Field(default_factory=list)
    """The names people reach the console by (the Host header the proxy forwards, e.g.
    agentrun.example.com): any other is refused (DNS rebinding). Required when enabled."""
    url: str = Field("", max_length=2048)
    """The console's public URL (e.g. https://agentrun.example.com): the operator's notifications link
    to the Run's page under it (AGENTRUN_CONSOLE_URL). Empty: no link."""
    namespaces: list[str] = Field(default_factory=list)
    """The namespaces it shows; empty: for each person, those they may list Runs in."""
    replica_count: int = Field(1, ge=1, le=10)
    """Console replicas (each serves any person: no state is shared)."""
    port: int = Field(8080, ge=1024, le=65535)
    """Container port of the console."""
    service: ConsoleService = Field(default_factory=ConsoleService)
    """The console's Service, for the proxy."""
    resources: KubeObject = Field(
        default_factory=lambda: {
            "requests": {"cpu": "50m", "memory": "96Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    )
    """Resources of the console container."""


class Values(_Values):
    name_override: str = Field("", max_length=63)
    """Replaces the chart name in object names."""
    fullname_override: str = Field("", max_length=63)
    """Replaces the release's full name (the prefix of every object name)."""
    image: Image = Field(default_factory=Image)
    """The operator image."""
    image_pull_secrets: list[KubeObject] = Field(default_factory=list)
    """Pull secrets for the operator image ([{name: ...}])."""
    replica_count: int = Field(2, ge=0, le=10)
    """Operator replicas: one is active, the others stand by (needs peering.enabled)."""
    watch_namespaces: list[str] = Field(default_factory=list)
    """Empty: cluster-wide mode (a ClusterRole and ClusterRoleBinding). Otherwise namespace-scoped mode:
    the operator watches only these namespaces, with a Role and RoleBinding in each, and the chart
    creates no cluster-scoped object unless asked (crds.install, peering.installCrds,
    admission.install): a namespace administrator can install it once a cluster administrator has
    installed those."""
    crds: Crds = Field(default_factory=Crds)
    """The agentrun.dev CustomResourceDefinitions."""
    admission: Admission = Field(default_factory=Admission)
    """The admission policies the operator's fences rely on."""
    api_priority: ApiPriority = Field(default_factory=ApiPriority)
    """API Priority and Fairness for the operator, Lease renewals and agents' steps."""
    peering: Peering = Field(default_factory=Peering)
    """Several replicas, one active (kopf peering)."""
    health: Health = Field(default_factory=Health)
    """The health endpoint and probes."""
    metrics: Metrics = Field(default_factory=Metrics)
    """Prometheus metrics."""
    listen_address: str = Field("0.0.0.0", min_length=1, max_length=253)
    """The address the operator's health and metrics endpoints listen on. 0.0.0.0 (default): every
    address of the Pod, as usual. On a local cluster whose Pods share the host's network (the process
    node of `make cluster`), set $(POD_IP) so that replicas bind their own Pod IP and do not clash."""
    log_format: Literal["json", "text"] = "json"
    """Operator log format (AGENTRUN_LOG_FORMAT): json, one object per line with time, level, logger,
    message and the run, namespace and attempt it concerns; or text, for people."""
    operator: OperatorTuning = Field(default_factory=OperatorTuning)
    """Operator settings."""
    service_account: ServiceAccount = Field(default_factory=ServiceAccount)
    """The operator's ServiceAccount."""
    agents: Agents = Field(default_factory=Agents)
    """Where attempt Pods run, and as whom."""
    rbac: Rbac = Field(default_factory=Rbac)
    """RBAC objects."""
    state_store: StateStore = Field(default_factory=StateStore)
    """Where agent state goes when it outgrows a Kubernetes object."""
    resources: KubeObject = Field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    )
    """Resources of the operator container."""
    pod_security_context: KubeObject = Field(
        default_factory=lambda: {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    )
    """Pod security context (the defaults meet the restricted Pod Security Standard)."""
    security_context: KubeObject = Field(
        default_factory=lambda: {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    )
    """Container security context of the operator and of the `helm test` Pod."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the operator Pods."""
    pod_labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels of the operator Pods."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector of the operator Pods."""
    tolerations: list[KubeObject] = Field(default_factory=list)
    """Tolerations of the operator Pods."""
    affinity: KubeObject = Field(default_factory=dict)
    """Affinity of the operator Pods."""
    topology_spread_constraints: list[KubeObject] = Field(default_factory=list)
    """Topology spread constraints of the operator Pods (e.g. one replica per zone)."""
    priority_class_name: str = Field("", max_length=253)
    """Priority class of the operator Pods."""
    termination_grace_period_seconds: int = Field(30, ge=1, le=600)
    """Time a stopping replica has to finish its work and hand over to a standby."""
    pod_disruption_budget: PodDisruptionBudget = Field(default_factory=PodDisruptionBudget)
    """The operator's PodDisruptionBudget."""
    console: Console = Field(default_factory=Console)
    """The web console in the cluster, behind an OIDC proxy (off by default; people can always run
    `kubectl agentrun console` on their own machine instead)."""
    global_: KubeObject = Field(default_factory=dict, alias="global")
    """Values a parent chart shares with its dependencies (unused by this chart)."""
