//! The gateway's configuration file ([`Config`]) and its defaults: plain data, read by
//! [`crate::state`] when it resolves a gateway.
//!
//! Must not know: anything that runs (no listener, no client, no store is opened here).

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::storage_client;
use htfaas_functions::sources;

/// Gateway configuration (a TOML/JSON file or the `htfaas up` defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP API address. Tests use `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// URL under which EPs reach this API (module downloads). Default: `http://<bound
    /// address>`, `https://…` with TLS.
    #[serde(default)]
    pub public_url: Option<String>,
    /// TLS certificate chain of the API, PEM (leaf first, then intermediates). With
    /// `tls_key_file`, the API is served over HTTPS only: API tokens, module uploads and
    /// module downloads travel over it. Default: none (plain HTTP, for one host's loopback).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// NATS server with JetStream, e.g. `nats://127.0.0.1:14222`.
    pub nats_url: String,
    /// The gateway's NATS credential: an nkey user seed (`SU…`), a secret. It needs the
    /// JetStream API (`$JS.API.>`), acks (`$JS.ACK.>`) and its inbox
    /// (`_INBOX.<its public key>.>`); it publishes no event. Default: none (a server without
    /// authorization).
    #[serde(default)]
    pub nats_nkey_seed: Option<htfaas_functions::nats::NatsCredential>,
    /// Which storage paths each events subject may speak for, tried in order, the first
    /// matching subject pattern deciding, e.g. `[{"subject": "storage.dcache.billing", "paths":
    /// ["/data/"]}, {"subject": "storage.cloudevents.xrootd-notify", "paths": ["/store/"]}]`.
    /// An event outside its subject's paths, or on a subject no rule names, is refused,
    /// counted (`events_out_of_bounds`) and acked. Default: none, and then every subject speaks
    /// for every path (one trusted storage; logged at start). See [`sources::binding`].
    #[serde(default)]
    pub source_paths: Option<Vec<sources::binding::SourcePaths>>,
    /// Durable consumer name on the events stream. Default: `gateway`.
    #[serde(default = "default_consumer")]
    pub consumer: String,
    /// Directory of the function registry (SQLite + modules).
    pub registry_dir: PathBuf,
    /// Storage base URL (dCache WebDAV door, XRootD HTTPS endpoint or the built-in storage),
    /// without trailing `/`.
    pub storage_url: String,
    /// Which macaroon-request dialect the storage speaks: `"dcache"` (also the built-in
    /// storage) or `"xrootd"` (XrdMacaroons; validities must then be `PT…` with H/M/S units).
    /// Default: `dcache`.
    #[serde(default)]
    pub storage_kind: storage_client::StorageKind,
    /// User the gateway authenticates as when asking the storage for macaroons (HTTP Basic).
    /// Unused, and may be empty, when a client certificate is configured.
    #[serde(default)]
    pub storage_user: String,
    /// That user's secret (HTTP Basic). Unused, and may be empty, with a client certificate.
    #[serde(default)]
    pub storage_secret: String,
    /// Extra trusted root certificate(s) for the storage's TLS, PEM (e.g. a site or test CA),
    /// in addition to the system's. Default: none.
    #[serde(default)]
    pub storage_ca_file: Option<PathBuf>,
    /// x509 client certificate (PEM, may include the chain) the gateway authenticates to the
    /// storage with, instead of HTTP Basic; needs `storage_client_key`. XRootD requires this.
    /// Default: none.
    #[serde(default)]
    pub storage_client_cert: Option<PathBuf>,
    /// Private key of `storage_client_cert`, PEM (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(default)]
    pub storage_client_key: Option<PathBuf>,
    /// Scheduler base URL (`https://…` when the scheduler serves TLS).
    pub scheduler_url: String,
    /// Extra trusted root certificate(s) for the scheduler's TLS, PEM, in addition to the
    /// system's. Default: none.
    #[serde(default)]
    pub scheduler_ca_file: Option<PathBuf>,
    /// Hosts a function's failure webhook may name (exact, case-insensitive):
    /// `hooks.example.org` for port 443 only, `hooks.example.org:8443` for that port. A manifest
    /// naming another host or port is refused at registration, and a delivery to one no longer
    /// listed is not sent. Default: none (no webhooks).
    #[serde(default)]
    pub webhook_hosts: Vec<String>,
    /// The site's time zone (an IANA name, e.g. `Europe/Berlin`, from the system's tzdb): the
    /// functions' schedules (`trigger.schedule`) are read in it. Default: `UTC`.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// Internal networks (CIDRs, e.g. `10.20.0.0/16`) a webhook receiver may lie in. A listed
    /// host that resolves to a loopback, link-local, private or shared address outside them is
    /// not called (an address listed as a host in `webhook_hosts` is allowed as such).
    /// Default: none (public addresses only).
    #[serde(default)]
    pub webhook_private_networks: Vec<String>,
    /// Extra trusted root certificate(s) for webhook receivers' TLS, PEM, in addition to the
    /// system's. Default: none.
    #[serde(default)]
    pub webhook_ca_file: Option<PathBuf>,
    /// Admin token of the scheduler, for proxying job and accounting queries.
    pub scheduler_admin_token: String,
    /// Ed25519 PKCS#8 PEM key that signs submit tokens; created if absent.
    pub signing_key_file: PathBuf,
    /// Where the public half is written as JWKS for the scheduler to trust. Default: beside the key.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// `iss` of submit tokens. Default: `htfaas-gateway`.
    #[serde(default = "default_issuer")]
    pub issuer: String,
    /// Bearer token for this API's admin routes.
    pub admin_token: String,
    /// Validity of read macaroons, ISO-8601. Default: `PT2H`.
    #[serde(default = "default_read_validity")]
    pub read_validity: String,
    /// Validity of write macaroons, ISO-8601. Default: `PT4H`.
    #[serde(default = "default_write_validity")]
    pub write_validity: String,
    /// Lifetime of a submit token, seconds: it is used at once. Default: 300.
    #[serde(default = "default_token_ttl_s")]
    pub token_ttl_s: u64,
    /// Replicas of the events stream when the gateway makes it, or widens one with fewer (a
    /// NATS cluster keeps each message on this many servers; 3 survives the loss of one).
    /// Default: 1 (one server).
    #[serde(default = "default_events_stream_replicas")]
    pub events_stream_replicas: usize,
    /// Deliveries of one event before JetStream gives up on it. Default: 20.
    #[serde(default = "default_max_deliver")]
    pub max_deliver: i64,
    /// Bind each job's macaroons to the EP that runs it: the scheduler adds `ip:<the EP's
    /// address as it sees it>` at dispatch (`SubmitRequest::bind_ep_address`). Only with
    /// `storage_kind: dcache` (dCache, the built-in storage); refused with `xrootd`, which fails
    /// any caveat it does not know. Set it only where EPs reach the storage from the address
    /// they reach the scheduler from (no NAT or proxy between them that differs). Default: false.
    #[serde(default)]
    pub bind_macaroons_to_ep: bool,
    /// Where jobs keep their checkpoints in the storage: an absolute directory ending in `/`,
    /// outside every user's namespace (its files are reached only with a job's checkpoint
    /// macaroon), e.g. `/checkpoints/`. Each job of a function that asks for checkpoints gets
    /// its own area below it, `<dir><owner>/<random id>/`, and a macaroon to read, write and
    /// replace exactly that area. Events on paths below it fire nothing. Only with
    /// `storage_kind: dcache` (XRootD's macaroons cannot replace a file). Default: none (a
    /// function asking for checkpoints is refused).
    #[serde(default)]
    pub checkpoint_dir: Option<String>,
    /// Which event sources and types become events, e.g.
    /// `{"dcache_msg_types": ["transfer", "request", "remove"], "cloudevents": true}`; an
    /// unknown type name is refused at start. Default: dCache `transfer` messages and every
    /// CloudEvent (see [`sources::SourcePolicy`]).
    #[serde(default)]
    pub sources: sources::SourcePolicy,
    /// Directory of the gateway's own state: the durable firing table `firings.sqlite`
    /// ([`crate::firing`]: events queued to become jobs, and the keys that make each (event,
    /// function) start one job). Default: the parent of `registry_dir` (the stack's `gateway/`).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How long a firing's key (event id, function, digest) is kept after the firing was made,
    /// seconds: a copy of the event within it starts nothing. Default: 604800 (7 days), the
    /// events stream's `max_age`, so every redelivery the stream can still make falls inside the
    /// window. Past it, the scheduler's own dedupe key (kept forever) still refuses a second job.
    #[serde(default = "default_dedupe_window_s")]
    pub dedupe_window_s: u64,
    /// Most firings being prepared (macaroons) and submitted at once, so that one slow answer
    /// does not hold back the others. Default: 16.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Ed25519 PKCS#8 PEM key that signs the gateway audit trail's checkpoints (kid
    /// `gateway-audit-1`); created (mode 0600) if absent. The trail itself lives in the firing
    /// table's file, written in the same transactions as the decisions it records
    /// ([`crate::audit`]). Default: `gateway-audit-key.pem` in the state directory.
    #[serde(default)]
    pub audit_key_file: Option<PathBuf>,
    /// The audit trail's head is signed once this many records have no checkpoint. Default: 1000.
    #[serde(default = "default_audit_checkpoint_records")]
    pub audit_checkpoint_records: u64,
    /// ... or once the last checkpoint is this old (checked every second), seconds. Default: 60.
    #[serde(default = "default_audit_checkpoint_s")]
    pub audit_checkpoint_s: u64,
    /// The site's namespace grants: which storage paths each owner (or `group:<name>`) may
    /// trigger on and read, where it may write (and replace) outputs, which annexes it may ask
    /// for, e.g. `[{"principal": "alice", "right": "read", "value": "/data/alice/"}]`. An owner
    /// with no grant may do nothing; admins add grants at run time (`htfaas ns grant`, kept in
    /// the registry), but only this list takes its own grants back. Default: none.
    #[serde(default)]
    pub namespaces: Vec<htfaas_functions::namespace::Grant>,
    /// The site's OIDC issuers whose bearer tokens the API accepts beside its own API tokens
    /// (see [`crate::oidc`]), e.g. `[{"issuer": "https://login.example.org/realms/site",
    /// "audience": "htfaas"}]`. Their identities become owners through `identity_map`.
    /// Default: none.
    #[serde(default)]
    pub oidc_issuers: Vec<crate::oidc::IssuerConfig>,
    /// The identity map file (JSON; [`htfaas_functions::identity_map`]): which owner, accounting
    /// groups and grants each identity of `oidc_issuers` becomes; watched and reloaded when it
    /// changes. Required with `oidc_issuers`. Default: none.
    #[serde(default)]
    pub identity_map: Option<PathBuf>,
    /// Whether the firing table fsyncs each commit (`fsync`, the default: WAL with
    /// `synchronous=FULL`) or only writes it to its log (`log`: `synchronous=NORMAL`, survives a
    /// crash of the process, not of the machine). Either way a batch of events is one commit.
    #[serde(default)]
    pub durability: htfaas_functions::store::Durability,
    /// Key file sealing the functions' secrets in the registry (64 hex digits; created, 0600,
    /// when missing). Keep it apart from the registry's backups. Default:
    /// `<state_dir>/secrets.key`.
    #[serde(default)]
    pub secrets_key_file: Option<PathBuf>,
    /// The API listener's header and body idle timeouts and connection cap. Default: see
    /// [`htfaas_functions::serve::Limits`].
    #[serde(default)]
    pub http: htfaas_functions::serve::Limits,
    /// How many distinct modules, and how many bytes of them, each owner may upload
    /// (`PUT /v1/modules` with a developer token; an admin's uploads count against none).
    /// Default: 100 modules, 1 GiB.
    #[serde(default)]
    pub module_quota: htfaas_functions::registry::ModuleQuota,
}

/// Default of [`Config::audit_checkpoint_records`].
pub fn default_audit_checkpoint_records() -> u64 {
    htfaas_functions::audit::CheckpointPolicy::default().every_records
}
/// Default of [`Config::audit_checkpoint_s`].
pub fn default_audit_checkpoint_s() -> u64 {
    htfaas_functions::audit::CheckpointPolicy::default().every_ms / 1000
}

fn default_time_zone() -> String {
    "UTC".into()
}

pub(crate) fn default_consumer() -> String {
    "gateway".into()
}
pub(crate) fn default_issuer() -> String {
    "htfaas-gateway".into()
}
pub(crate) fn default_read_validity() -> String {
    "PT2H".into()
}
pub(crate) fn default_write_validity() -> String {
    "PT4H".into()
}
pub(crate) fn default_token_ttl_s() -> u64 {
    300
}
pub(crate) fn default_events_stream_replicas() -> usize {
    1
}

pub(crate) fn default_max_deliver() -> i64 {
    20
}
pub(crate) fn default_dedupe_window_s() -> u64 {
    htfaas_functions::proto::EVENTS_MAX_AGE_S
}
pub(crate) fn default_max_in_flight() -> usize {
    16
}
