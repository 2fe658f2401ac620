"""The etcd key schema, in one place (docs/ARCHITECTURE.md, "Metadata in etcd"). Values are
`shadowtopic.pb.storage.v1` messages (see proto/shadowtopic/pb/storage/v1/metadata.proto)
unless noted.

    /shadowtopic/clusters/<c>/brokers/<id>            BrokerInfo, under the broker's lease
    /shadowtopic/clusters/<c>/ownership/<topic-path>  Ownership, under the owner's lease
    /shadowtopic/topics/<topic-path>/info             TopicInfo
    /shadowtopic/topics/<topic-path>/ledgers          LedgerList
    /shadowtopic/topics/<topic-path>/epoch            counter (ascii int): ownership epochs
    /shadowtopic/topics/<topic-path>/shadows          ShadowList (partitioned source: the parent's)
    /shadowtopic/topics/<topic-path>/replicators/<shadow-topic-path>
                                                      ascii "L:E": the replicator's durable position
    /shadowtopic/topics/<topic-path>/shadow-needs/<shadow-topic-path>
                                                      ascii "L:E": the oldest position the shadow's
                                                      durable subscriptions still need (written
                                                      by the shadow's owner; absent: none)
    /shadowtopic/topics/<topic-path>/compaction       CompactionPointer
    /shadowtopic/topics/<topic-path>/jobs/compaction/<id>
                                                      CompactionJob record (formerly under
                                                      .../compaction/jobs/<id>: moved by
                                                      source/metadata/migrate.py)
    /shadowtopic/topics/<topic-path>/subscriptions/<sub>
    /shadowtopic/topics/<topic-path>/cursors          CursorPointer (cursors.proto): durable cursors
    /shadowtopic/wal-commits/<topic-path>/<ledger:020d>/<first:020d>
                                                      WalCommit: a flush window's batches of an
                                                      open ledger in a WAL object (written by
                                                      the owner: source/ledger/object_wal.py)
    /shadowtopic/counters/ledger-id                   counter (ascii int): cluster-unique ledger ids
    /shadowtopic/clusters/<c>/compaction/requests/<topic-path>
                                                      CompactionRequest: a queued or running
                                                      compaction (filed by the topic's owner)
    /shadowtopic/clusters/<c>/compaction/claims/<topic-path>
                                                      ascii worker id, under that worker's lease
    /shadowtopic/migrations/<name>                    ascii: a migration of the schema that
                                                      ran (source/metadata/migrate.py)
    /shadowtopic/tenants/<tenant>                     TenantInfo: the tenant exists, its admin
                                                      roles (source/metadata/tenants.py)
    /shadowtopic/namespaces/<tenant>/<namespace>/info NamespaceInfo: the namespace exists
    /shadowtopic/permissions/namespaces/<tenant>/<namespace>
    /shadowtopic/permissions/topics/<topic-path>      Grants: the actions granted per role
                                                      on a namespace, on a topic (every
                                                      broker follows the prefix:
                                                      source/metadata/grants.py)
    /shadowtopic/namespaces/<tenant>/<namespace>/policies
                                                      Policies: only the fields
                                                      set on the namespace, the defaults of its
                                                      topics (source/metadata/namespace_policies.py)

<topic-path> is `persistent/<tenant>/<namespace>/<topic>` (TopicName.path), so a namespace's
topics list under one prefix and no topic name is a prefix of another's keys.

A topic's one-value keys (info, ledgers, epoch, shadows, compaction, cursors) are never a
prefix of another key: a follower (source/metadata/follow.py) watches its key as a prefix,
since etcd watches ranges, so any longer key would wake it with every write. Hence the
compaction job records, rewritten with every progress report, live under `jobs/`, not
under `compaction` (tests/test_source/metadata/test_metadata_keys.py checks this).
"""
from __future__ import annotations

from shadowtopic.core.names import TopicName

ROOT = "/shadowtopic"
LEDGER_ID_COUNTER = f"{ROOT}/counters/ledger-id"
MIGRATIONS_PREFIX = f"{ROOT}/migrations/"


def migration(name: str) -> str:
    """Marker of a schema migration that ran to its end (source/metadata/migrate.py)."""
    return MIGRATIONS_PREFIX + name


#: every namespace's policies are under it (each broker follows it)
NAMESPACES_PREFIX = f"{ROOT}/namespaces/"


def namespace_policies(namespace: str) -> str:
    """The policies of `namespace` ("tenant/namespace", already validated)."""
    return f"{NAMESPACES_PREFIX}{namespace}/policies"


def namespace_from_policies_key(key: str) -> str | None:
    """Inverse of `namespace_policies`: "tenant/namespace" (None: not such a key)."""
    if not key.startswith(NAMESPACES_PREFIX) or not key.endswith("/policies"):
        return None
    parts = key[len(NAMESPACES_PREFIX):-len("/policies")].split("/")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None


#: every tenant is a key under it
TENANTS_PREFIX = f"{ROOT}/tenants/"
#: every grant (namespace and topic level) is under it (each broker follows it)
PERMISSIONS_PREFIX = f"{ROOT}/permissions/"
_NS_GRANTS = PERMISSIONS_PREFIX + "namespaces/"
_TOPIC_GRANTS = PERMISSIONS_PREFIX + "topics/"


def tenant(name: str) -> str:
    return TENANTS_PREFIX + name


def namespace_prefix(namespace: str) -> str:
    """Every key of `namespace` ("tenant/namespace") under NAMESPACES_PREFIX."""
    return f"{NAMESPACES_PREFIX}{namespace}/"


def namespace_info(namespace: str) -> str:
    """The namespace exists ("tenant/namespace", already validated)."""
    return f"{NAMESPACES_PREFIX}{namespace}/info"


def namespace_from_info_key(key: str) -> str | None:
    """Inverse of `namespace_info` (None: not such a key)."""
    if not key.startswith(NAMESPACES_PREFIX) or not key.endswith("/info"):
        return None
    parts = key[len(NAMESPACES_PREFIX):-len("/info")].split("/")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None


def namespace_grants(namespace: str) -> str:
    return _NS_GRANTS + namespace


def topic_grants(topic: TopicName) -> str:
    """Grants on a topic (a partitioned topic's are its parent's: the caller names that)."""
    return _TOPIC_GRANTS + topic.path


def grants_of_namespace_prefix(namespace: str) -> str:
    """The topic-level grants of every topic of `namespace`."""
    return f"{_TOPIC_GRANTS}persistent/{namespace}/"


def grants_of_tenant_prefixes(tenant_name: str) -> tuple[str, str]:
    """Every namespace-level and topic-level grant of a tenant's namespaces."""
    return f"{_NS_GRANTS}{tenant_name}/", f"{_TOPIC_GRANTS}persistent/{tenant_name}/"


def grants_target(key: str) -> str | TopicName | None:
    """Inverse of `namespace_grants` ("tenant/namespace") and `topic_grants` (a TopicName);
    None: not such a key."""
    if key.startswith(_NS_GRANTS):
        parts = key[len(_NS_GRANTS):].split("/")
        return "/".join(parts) if len(parts) == 2 and all(parts) else None
    if key.startswith(_TOPIC_GRANTS + "persistent/"):
        parts = key[len(_TOPIC_GRANTS + "persistent/"):].split("/")
        return TopicName(*parts) if len(parts) == 3 and all(parts) else None
    return None


def _t(topic: TopicName) -> str:
    return f"{ROOT}/topics/{topic.path}"


def topics_prefix(namespace: str | None = None) -> str:
    return f"{ROOT}/topics/persistent/{namespace}/" if namespace else f"{ROOT}/topics/"


def topic_prefix(topic: TopicName) -> str:
    return _t(topic) + "/"


def topic_info(topic: TopicName) -> str:
    return _t(topic) + "/info"


def ledgers(topic: TopicName) -> str:
    return _t(topic) + "/ledgers"


WAL_COMMITS_PREFIX = f"{ROOT}/wal-commits/"


def wal_commits_prefix(topic: TopicName) -> str:
    """Every WAL commit of a topic (apart from the topic's keys: no follower of the topic
    wakes with each flush window)."""
    return f"{WAL_COMMITS_PREFIX}{topic.path}/"


def wal_commits_of_ledger(topic: TopicName, ledger_id: int) -> str:
    return f"{wal_commits_prefix(topic)}{ledger_id:020d}/"


def wal_commit(topic: TopicName, ledger_id: int, first_entry_id: int) -> str:
    return f"{wal_commits_of_ledger(topic, ledger_id)}{first_entry_id:020d}"


def epoch_counter(topic: TopicName) -> str:
    return _t(topic) + "/epoch"


def shadows(topic: TopicName) -> str:
    return _t(topic) + "/shadows"


def replicator(source: TopicName, shadow: TopicName) -> str:
    """The durable position of the replicator from `source` to `shadow` (under the source's
    prefix: deleting the source deletes it; deleting the shadow deletes it too)."""
    return _t(source) + f"/replicators/{shadow.path}"


def shadow_needs(source: TopicName, shadow: TopicName) -> str:
    """The oldest position the durable subscriptions of `shadow` still need, published by
    the shadow's owner for the source's retention (policy retention_keeps_shadow_backlog).
    Under the source's prefix, so deleting the source deletes it; a shadow of a partitioned
    source publishes partition i under partition i of the source."""
    return _t(source) + f"/shadow-needs/{shadow.path}"


def shadow_needs_prefix(source: TopicName) -> str:
    return _t(source) + "/shadow-needs/"


def shadow_from_needs_key(source: TopicName, key: str) -> TopicName | None:
    """Inverse of `shadow_needs`: the shadow a key under `shadow_needs_prefix(source)` is
    for (None: not such a key)."""
    prefix = shadow_needs_prefix(source) + "persistent/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/")
    return TopicName(*parts) if len(parts) == 3 and all(parts) else None


def compaction(topic: TopicName) -> str:
    return _t(topic) + "/compaction"


def compaction_job(topic: TopicName, job_id: str) -> str:
    """The record of one compaction job of `topic` (CompactionJob, storage metadata.proto)."""
    return compaction_jobs_prefix(topic) + job_id


def compaction_jobs_prefix(topic: TopicName) -> str:
    """Not under `compaction(topic)`: a job's progress writes must not wake the pointer's
    followers (source/metadata/migrate.py moved the records from `.../compaction/jobs/`)."""
    return _t(topic) + "/jobs/compaction/"


def compaction_requests_prefix(cluster: str) -> str:
    """Queued or running compactions of the cluster's topics (the worker watches it)."""
    return f"{ROOT}/clusters/{cluster}/compaction/requests/"


def compaction_request(cluster: str, topic: TopicName) -> str:
    return compaction_requests_prefix(cluster) + topic.path


def compaction_claim(cluster: str, topic: TopicName) -> str:
    """Held (under its lease) by the compaction worker running the topic's request."""
    return f"{ROOT}/clusters/{cluster}/compaction/claims/{topic.path}"


def topic_from_compaction_request(cluster: str, key: str) -> TopicName | None:
    prefix = compaction_requests_prefix(cluster) + "persistent/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/")
    return TopicName(*parts) if len(parts) == 3 and all(parts) else None


def subscription(topic: TopicName, sub: str) -> str:
    return _t(topic) + f"/subscriptions/{sub}"


def subscriptions_prefix(topic: TopicName) -> str:
    return _t(topic) + "/subscriptions/"


def brokers_prefix(cluster: str) -> str:
    return f"{ROOT}/clusters/{cluster}/brokers/"


def broker(cluster: str, broker_id: str) -> str:
    return brokers_prefix(cluster) + broker_id


def ownership(cluster: str, topic: TopicName) -> str:
    return f"{ROOT}/clusters/{cluster}/ownership/{topic.path}"


def ownership_prefix(cluster: str) -> str:
    return f"{ROOT}/clusters/{cluster}/ownership/"


def topic_from_info_key(key: str) -> TopicName | None:
    """Inverse of `topic_info` (for listing topics by prefix)."""
    prefix = f"{ROOT}/topics/persistent/"
    if not key.startswith(prefix) or not key.endswith("/info"):
        return None
    parts = key[len(prefix):-len("/info")].split("/")
    return TopicName(*parts) if len(parts) == 3 else None


def topic_key_of(key: str) -> tuple[TopicName, str] | None:
    """A topic's one-value key (`info`, `ledgers`, `compaction`, ...) as (topic, its last
    segment); None for any other key (longer keys under a topic, keys of other kinds)."""
    prefix = f"{ROOT}/topics/persistent/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/")
    if len(parts) != 4 or not all(parts):
        return None
    return TopicName(*parts[:3]), parts[3]


def cursors(topic: TopicName) -> str:
    """`/shadowtopic/topics/<topic-path>/cursors`: the topic's CursorPointer (the durable
    cursor files it names are described in proto/shadowtopic/pb/storage/v1/cursors.proto)."""
    return _t(topic) + "/cursors"
