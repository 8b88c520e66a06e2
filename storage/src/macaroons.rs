//! dCache-compatible macaroons: issuing and verification with dCache's caveat rules.
//!
//! The bytes (V1, base64url without padding, the HMAC chain) are handled by the codec,
//! [`htfaas_functions::macaroon`], the one module that touches the `macaroon` crate; this
//! module gives the caveats their meaning.
//!
//! **Key.** The root key is `HMAC-SHA256("macaroons-key-generator", secret)`
//! ([`RootKey::derive`]), the libmacaroons/pymacaroons convention, so any of those libraries
//! holding the secret verifies our tokens. [`RootKey::raw`] is dCache's raw-key convention.
//!
//! **Verification** ([`verify`]): the codec authenticates the HMAC chain in constant time and
//! refuses third-party caveats. Then every first-party caveat is checked with the full
//! request context, following dCache's `CaveatType` grammar (see `shared/reference/dcache.md` §3.3):
//!
//! | key | rule |
//! |---|---|
//! | `before:` | RFC 3339 instant; every one must lie in the future, give or take [`CLOCK_SKEW`] |
//! | `activity:` | comma list; each later set must be a subset of the previous one, else the macaroon is invalid; the requested activities must all be in the final set |
//! | `path:` | chained relative to the previous one (`/a` then `/b` is `/a/b`); the request path must be within the result, segment-aware |
//! | `max-upload:` | bytes, > 0; the smallest wins |
//! | `ip:` | comma list of addresses or CIDRs; the client must match one (OR within a caveat) of every `ip:` caveat (AND across caveats) |
//! | `iid:` | informational; only as the first caveat, at most once (dCache) |
//! | `id:` | informational; at most once (dCache). As the second caveat, right after `iid:`, it can only have been put there by the issuer (a holder can only append): it is then the macaroon's *writer*, [`Restrictions::writer`], which names the principal and function a write macaroon was issued for; see [`issue`] |
//! | `name:` | informational (XRootD) |
//!
//! Any other key (including dCache's `root:`, `home:`) invalidates the macaroon.
//! Structural problems (bad signature, unparsable, unknown key, widened activity, …) are
//! [`VerifyError::Invalid`] (HTTP 401); caveats that are well-formed but not met by this
//! request (expired, wrong activity, path outside) are [`VerifyError::Denied`] (HTTP 403).

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use htfaas_functions::macaroon as codec;
use time::OffsetDateTime;

use crate::paths;

/// The longest validity we issue; longer requests are capped to it (dCache's `max-lifetime`).
pub const MAX_VALIDITY: time::Duration = time::Duration::days(7);
/// Validity when the request names none (dCache's `default-lifetime`).
pub const DEFAULT_VALIDITY: time::Duration = time::Duration::days(1);
/// How long past a `before:` instant a macaroon still passes: the clock skew allowed between
/// components ([`htfaas_functions::token::LEEWAY_S`], as for tokens). The scheduler cuts a job's
/// macaroons to the job's deadline by its own clock; this storage checks them by its own, and
/// an EP's last output PUT right at the deadline must not fail because the two clocks differ by
/// a few seconds. A job's run time is enforced by the scheduler and the EP, not here.
pub const CLOCK_SKEW: time::Duration = time::Duration::seconds(htfaas_functions::token::LEEWAY_S as i64);

/// A dCache activity, as named in `activity:` caveats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Activity {
    /// stat.
    ReadMetadata,
    /// chmod, chown.
    UpdateMetadata,
    /// readdir.
    List,
    /// read a file (GET).
    Download,
    /// mkdir and friends.
    Manage,
    /// write a new file (PUT).
    Upload,
    /// remove, and overwrite together with UPLOAD.
    Delete,
    /// bring online from tape.
    Stage,
}

impl Activity {
    /// Every activity.
    pub const ALL: [Activity; 8] = [
        Activity::ReadMetadata,
        Activity::UpdateMetadata,
        Activity::List,
        Activity::Download,
        Activity::Manage,
        Activity::Upload,
        Activity::Delete,
        Activity::Stage,
    ];

    /// The upper-case name used in caveats.
    pub fn as_str(self) -> &'static str {
        match self {
            Activity::ReadMetadata => "READ_METADATA",
            Activity::UpdateMetadata => "UPDATE_METADATA",
            Activity::List => "LIST",
            Activity::Download => "DOWNLOAD",
            Activity::Manage => "MANAGE",
            Activity::Upload => "UPLOAD",
            Activity::Delete => "DELETE",
            Activity::Stage => "STAGE",
        }
    }

    /// Parses [`Activity::as_str`] (exact, upper-case).
    pub fn parse(s: &str) -> Option<Activity> {
        Activity::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl fmt::Display for Activity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub use codec::{RootKey, attenuate, inspect};

/// A caveat that breaks dCache's grammar or combination rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaveatError {
    /// Not `key:value`, or a key we do not know.
    #[error("unknown caveat {0:?}")]
    Unknown(String),
    /// A known key with a value that does not parse.
    #[error("malformed caveat {caveat:?}: {reason}")]
    Malformed {
        /// The caveat.
        caveat: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A later `activity:` with an activity the earlier set lacks.
    #[error("caveat {0:?} attempts to enlarge the activity set")]
    EnlargedActivity(String),
}

fn malformed(caveat: &str, reason: impl Into<String>) -> CaveatError {
    CaveatError::Malformed { caveat: caveat.to_owned(), reason: reason.into() }
}

/// What a chain of first-party caveats allows, folded in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restrictions {
    /// Effective `path:` (clean, `/` when there is none).
    pub path: String,
    /// Effective `activity:` set; `None` when there is no activity caveat (everything).
    pub activities: Option<BTreeSet<Activity>>,
    /// Earliest `before:`.
    pub before: Option<OffsetDateTime>,
    /// Smallest `max-upload:`.
    pub max_upload: Option<u64>,
    /// One entry per `ip:` caveat: the client must match a network of every entry.
    pub ips: Vec<Vec<IpNet>>,
    /// The issuer's `id:` (the second caveat, right after `iid:`): who the macaroon was issued
    /// for, e.g. `run:alice/checksum`. A caveat a holder appends can never be there.
    pub writer: Option<String>,
    /// Caveats folded so far.
    count: usize,
    seen_iid: bool,
    seen_id: bool,
}

impl Default for Restrictions {
    fn default() -> Self {
        Restrictions {
            path: "/".into(),
            activities: None,
            before: None,
            max_upload: None,
            ips: Vec::new(),
            writer: None,
            count: 0,
            seen_iid: false,
            seen_id: false,
        }
    }
}

impl Restrictions {
    /// Folds a list of caveats, failing on the first bad one.
    pub fn from_caveats<'a>(caveats: impl IntoIterator<Item = &'a str>) -> Result<Restrictions, CaveatError> {
        let mut r = Restrictions::default();
        for c in caveats {
            r.apply(c)?;
        }
        Ok(r)
    }

    /// Folds one more caveat (see the module doc for the rules).
    pub fn apply(&mut self, caveat: &str) -> Result<(), CaveatError> {
        let Some((key, value)) = caveat.split_once(':') else {
            return Err(CaveatError::Unknown(caveat.to_owned()));
        };
        let index = self.count;
        self.count += 1;
        match key {
            "before" => {
                let t = htfaas_functions::time::parse_rfc3339_ms(value)
                    .and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok())
                    .ok_or_else(|| malformed(caveat, "not an RFC 3339 time after 1970".to_owned()))?;
                self.before = Some(self.before.map_or(t, |b| b.min(t)));
            }
            "activity" => {
                let set = parse_activities(value).map_err(|r| malformed(caveat, r))?;
                if let Some(prev) = &self.activities
                    && !set.is_subset(prev)
                {
                    return Err(CaveatError::EnlargedActivity(caveat.to_owned()));
                }
                self.activities = Some(set);
            }
            "path" => {
                if value.is_empty() {
                    return Err(malformed(caveat, "empty path"));
                }
                self.path = paths::chain(&self.path, value).map_err(|e| malformed(caveat, e.to_string()))?;
            }
            "max-upload" => {
                let n: u64 = value.parse().map_err(|_| malformed(caveat, "not a byte count"))?;
                if n == 0 {
                    return Err(malformed(caveat, "must be > 0"));
                }
                self.max_upload = Some(self.max_upload.map_or(n, |m| m.min(n)));
            }
            "ip" => {
                let nets = value.split(',').map(|n| n.trim().parse::<IpNet>()).collect::<Result<Vec<_>, _>>();
                let nets = nets.map_err(|e| malformed(caveat, e))?;
                if nets.is_empty() {
                    return Err(malformed(caveat, "empty address list"));
                }
                self.ips.push(nets);
            }
            "iid" => {
                if index != 0 || self.seen_iid {
                    return Err(malformed(caveat, "iid must be the first caveat and unique"));
                }
                self.seen_iid = true;
            }
            "id" => {
                if self.seen_id {
                    return Err(malformed(caveat, "id must be unique"));
                }
                self.seen_id = true;
                if index == 1 && self.seen_iid {
                    self.writer = Some(value.to_owned());
                }
            }
            "name" => {}
            _ => return Err(CaveatError::Unknown(caveat.to_owned())),
        }
        Ok(())
    }

    /// Whether `client` matches one network of every `ip:` caveat (always, without any).
    pub fn allows_client(&self, client: Option<IpAddr>) -> bool {
        self.ips.is_empty()
            || client.is_some_and(|c| {
                let c = c.to_canonical();
                self.ips.iter().all(|nets| nets.iter().any(|n| n.contains(c)))
            })
    }

    /// Whether every activity in `wanted` is allowed.
    pub fn allows(&self, wanted: Activity) -> bool {
        self.activities.as_ref().is_none_or(|set| set.contains(&wanted))
    }
}

/// An address or a CIDR network (`192.0.2.0/24`, `2001:db8::/32`, `127.0.0.1`), as dCache's
/// `ip:` caveat lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` (canonical: IPv4-mapped IPv6 already turned into IPv4) is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<IpNet, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: bad prefix length"))?,
        };
        Ok(IpNet { addr, prefix })
    }
}

fn parse_activities(value: &str) -> Result<BTreeSet<Activity>, String> {
    let mut set = BTreeSet::new();
    for name in value.split(',') {
        let name = name.trim();
        set.insert(Activity::parse(name).ok_or_else(|| format!("unknown activity {name:?}"))?);
    }
    Ok(set)
}

/// Why a presented macaroon was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Not a valid macaroon of ours: unparsable, bad signature, third-party or unknown caveat,
    /// broken combination rules. HTTP 401.
    #[error("invalid macaroon: {0}")]
    Invalid(String),
    /// Valid, but a caveat forbids this request. HTTP 403.
    #[error("macaroon does not allow this request: {0}")]
    Denied(String),
}

/// The request a macaroon is checked against.
#[derive(Debug, Clone)]
pub struct Access<'a> {
    /// Clean absolute namespace path.
    pub path: &'a str,
    /// Activities the request needs, all of them.
    pub activities: &'a [Activity],
    /// The time to check `before:` against.
    pub now: OffsetDateTime,
    /// The client's address, for `ip:` caveats (`None`: unknown, so any `ip:` caveat denies).
    pub client: Option<IpAddr>,
}

/// What a verified macaroon grants beyond yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The macaroon identifier (lossy UTF-8), for the billing subject `MacaroonPrincipal[..]`.
    pub identifier: String,
    /// Folded restrictions.
    pub restrictions: Restrictions,
}

/// Parses, authenticates and checks `token` for `access` (see the module doc).
pub fn verify(token: &str, key: &RootKey, access: &Access<'_>) -> Result<Grant, VerifyError> {
    let m = codec::authenticate(token, key).map_err(|e| VerifyError::Invalid(e.to_string()))?;
    let r = Restrictions::from_caveats(m.caveats.iter().map(String::as_str))
        .map_err(|e| VerifyError::Invalid(e.to_string()))?;
    if let Some(before) = r.before
        && access.now >= before + CLOCK_SKEW
    {
        return Err(VerifyError::Denied(format!(
            "expired at {} (this storage's clock reads {}, past the {} s allowed clock skew)",
            format_instant(before),
            format_instant(access.now),
            CLOCK_SKEW.whole_seconds()
        )));
    }
    if let Some(missing) = access.activities.iter().find(|a| !r.allows(**a)) {
        return Err(VerifyError::Denied(format!("activity {missing} not allowed")));
    }
    if !paths::is_within(access.path, &r.path) {
        return Err(VerifyError::Denied(format!("path {} is outside {}", access.path, r.path)));
    }
    if !r.allows_client(access.client) {
        let client = access.client.map_or_else(|| "unknown".to_owned(), |c| c.to_string());
        return Err(VerifyError::Denied(format!("client address {client} is not allowed by the ip: caveats")));
    }
    Ok(Grant { identifier: m.identifier, restrictions: r })
}

/// Mints a V1 macaroon with exactly these caveats (no checks). Low level; [`issue`] applies dCache's request rules.
pub(crate) fn mint(key: &RootKey, location: &str, identifier: &str, caveats: &[String]) -> String {
    codec::mint(key, location, identifier, caveats).expect("identifier is non-empty: callers pass a random one")
}

/// `YYYY-MM-DDTHH:MM:SSZ`, the second-precision form both dCache and XRootD parse.
pub fn format_instant(t: OffsetDateTime) -> String {
    htfaas_functions::time::utc_timestamp(u64::try_from(t.unix_timestamp()).unwrap_or(0))
}

/// Parses an ISO-8601 duration as Java's `Duration.parse` and dCache accept it, without sign:
/// `PnW`, `PnD`, `PTnHnMn.nS` and combinations like `P1DT12H`. Years and months are refused
/// (not fixed lengths).
pub fn parse_duration(s: &str) -> Option<time::Duration> {
    let rest = s.strip_prefix('P').or_else(|| s.strip_prefix('p'))?;
    let (date, timepart) = match rest.split_once(['T', 't']) {
        Some((d, t)) => {
            if t.is_empty() {
                return None;
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    if date.is_empty() && timepart.is_none() {
        return None;
    }
    let mut total = time::Duration::ZERO;
    total += parse_units(date, &[('W', 7 * 86400), ('D', 86400)], false)?;
    if let Some(t) = timepart {
        total += parse_units(t, &[('H', 3600), ('M', 60), ('S', 1)], true)?;
    }
    Some(total)
}

/// Parses `<number><unit>…` with the units in the given order, each at most once.
fn parse_units(s: &str, units: &[(char, i64)], fraction_on_last: bool) -> Option<time::Duration> {
    let mut total = time::Duration::ZERO;
    let mut rest = s;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (num, tail) = rest.split_at(end);
        let unit = tail.chars().next()?.to_ascii_uppercase();
        let pos = units.iter().skip(next_unit).position(|(u, _)| *u == unit)? + next_unit;
        next_unit = pos + 1;
        let secs_per = units[pos].1;
        let is_last = pos == units.len() - 1;
        let (int, frac) = match num.split_once('.') {
            Some((i, f))
                if fraction_on_last
                    && is_last
                    && !f.is_empty()
                    && f.len() <= 9
                    && f.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (i, Some(f))
            }
            Some(_) => return None,
            None => (num, None),
        };
        if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: i64 = int.parse().ok()?;
        total = total.checked_add(time::Duration::seconds(n.checked_mul(secs_per)?))?;
        if let Some(f) = frac {
            let nanos: i64 = format!("{f:0<9}").parse().ok()?;
            total = total.checked_add(time::Duration::nanoseconds(nanos))?;
        }
        rest = &tail[1..];
    }
    Some(total)
}

/// Why a macaroon request was refused (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// A caveat key a request may not carry.
    #[error("Bad requested caveat: {0:?} is not supported (allowed: activity, path, before, max-upload, ip)")]
    Unsupported(String),
    /// A caveat that breaks the grammar or the combination rules.
    #[error("Bad requested caveat: {0}")]
    BadCaveat(CaveatError),
    /// The expiry would not lie in the future.
    #[error("Bad requested caveat: the macaroon would already be expired")]
    Expired,
    /// The writer name is empty, too long or has control characters.
    #[error("Bad writer: {0}")]
    Writer(String),
}

// Shown in the message, so not also returned as its source (`{e:#}` would print it twice).
impl From<CaveatError> for IssueError {
    fn from(e: CaveatError) -> IssueError {
        IssueError::BadCaveat(e)
    }
}

/// A macaroon request (`POST` with `application/macaroon-request`), decoded.
#[derive(Debug, Clone, Default)]
pub struct IssueRequest {
    /// The request's URL path; a non-root path becomes the first `path:` caveat.
    pub url_path: Option<String>,
    /// Caveats from the body, in order.
    pub caveats: Vec<String>,
    /// Requested validity; [`DEFAULT_VALIDITY`] when absent, capped at [`MAX_VALIDITY`].
    pub validity: Option<time::Duration>,
    /// Who the macaroon is for, as its requester says (the gateway: `run:<principal>/<function>`
    /// for a job, `user:<name>` for a developer's file credential): the `id:` caveat right after
    /// `iid:`, so a holder cannot add or change it. A file written under the macaroon records it,
    /// and only a macaroon of the same writer and path scope rewrites that file without `DELETE`.
    pub writer: Option<String>,
}

/// Longest writer name ([`IssueRequest::writer`]), bytes.
pub const MAX_WRITER_BYTES: usize = 512;

/// A freshly issued macaroon.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The token (V1, base64url, no padding).
    pub token: String,
    /// Its identifier.
    pub identifier: String,
    /// Its effective restrictions.
    pub restrictions: Restrictions,
}

/// Issues a macaroon as dCache's `MacaroonRequestHandler` does. Caveat order:
/// `iid:`, `id:<writer>` (when the request names one; dCache puts the requester's identity
/// there), `before:` (the earliest of now+validity, body `before:`s and now+[`MAX_VALIDITY`]),
/// `path:<url path>` (unless `/`), then the body's other caveats in their order. Body `path:`
/// caveats therefore chain *relative* to the URL path (`POST /data` + `path:/raw` = `/data/raw`).
pub fn issue(key: &RootKey, location: &str, req: &IssueRequest, now: OffsetDateTime) -> Result<Issued, IssueError> {
    let mut expiry = now + req.validity.unwrap_or(DEFAULT_VALIDITY).min(MAX_VALIDITY);
    let mut rest = Vec::new();
    for c in &req.caveats {
        let key_part = c.split_once(':').map(|(k, _)| k);
        match key_part {
            Some("before") => {
                let r = Restrictions::from_caveats([c.as_str()])?;
                if let Some(b) = r.before {
                    expiry = expiry.min(b);
                }
            }
            Some("activity" | "path" | "max-upload" | "ip") => rest.push(c.clone()),
            _ => return Err(IssueError::Unsupported(c.clone())),
        }
    }
    let expiry = expiry.min(now + MAX_VALIDITY);
    if expiry <= now {
        return Err(IssueError::Expired);
    }
    let mut caveats = vec![format!("iid:{}", URL_SAFE_NO_PAD.encode(rand::random::<[u8; 6]>()))];
    if let Some(writer) = &req.writer {
        if writer.is_empty() || writer.len() > MAX_WRITER_BYTES || writer.chars().any(char::is_control) {
            return Err(IssueError::Writer(format!(
                "1 to {MAX_WRITER_BYTES} bytes without control characters, got {} bytes",
                writer.len()
            )));
        }
        caveats.push(format!("id:{writer}"));
    }
    caveats.push(format!("before:{}", format_instant(expiry)));
    if let Some(p) = req.url_path.as_deref().filter(|p| *p != "/") {
        caveats.push(format!("path:{p}"));
    }
    caveats.extend(rest);
    let restrictions = Restrictions::from_caveats(caveats.iter().map(String::as_str))?;
    if restrictions.before.is_some_and(|b| b <= now) {
        // Flooring to whole seconds can land at or before now for sub-second validities.
        return Err(IssueError::Expired);
    }
    let identifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 12]>());
    let token = mint(key, location, &identifier, &caveats);
    Ok(Issued { token, identifier, restrictions })
}

#[cfg(test)]
mod tests;
