//! A storage directory tree's files, read through WebDAV `PROPFIND` (`Depth: 1`, one directory
//! at a time, as dCache's WebDAV door, XrdHttp and the built-in storage answer it) under one
//! `LIST` macaroon for the tree (`events backfill`).
//!
//! The storage's answer is not trusted more than an event is: an href that does not decode to a
//! clean absolute path inside the directory asked about is skipped, and the walk is bounded in
//! files, directories and bytes per answer.
//!
//! Must not know: functions, firings, jobs.

use crate::storage_client::{StorageClient, StorageError};
use htfaas_functions::manifest::is_clean_abs_path;
use quick_xml::events::Event;
use quick_xml::name::{Namespace, ResolveResult};
use std::collections::VecDeque;

/// The WebDAV namespace.
const DAV: &[u8] = b"DAV:";
/// Most bytes of one directory's answer.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Most directories one walk reads.
pub const MAX_DIRECTORIES: usize = 10_000;

/// One file of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its storage path.
    pub path: String,
    /// Bytes, when the storage says.
    pub size: Option<u64>,
    /// Last modification, Unix seconds, when the storage says.
    pub modified_s: Option<u64>,
}

/// A tree's files, in walk order (directory by directory, each sorted as the storage sent it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The files.
    pub files: Vec<Listed>,
    /// Whether the walk stopped at a bound before the whole tree was read.
    pub truncated: bool,
}

/// Why a tree could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The storage refused or failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Its answer is no multistatus.
    #[error("the storage's listing of {dir} is not WebDAV multistatus XML: {why}")]
    Malformed {
        /// The directory.
        dir: String,
        /// What is wrong.
        why: String,
    },
}

/// One `response` of a multistatus answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The href, percent-decoded: a path (a full URL's path part).
    pub path: String,
    /// Whether it is a collection.
    pub dir: bool,
    /// `getcontentlength`.
    pub size: Option<u64>,
    /// `getlastmodified`, Unix seconds.
    pub modified_s: Option<u64>,
}

/// The files under `dir` (a directory, ending in `/`), at most `max_files` of them.
pub async fn list_tree(storage: &StorageClient, dir: &str, max_files: usize) -> Result<Listing, ListError> {
    let macaroon = storage.list_macaroon(dir).await?;
    let mut listing = Listing::default();
    let mut queue = VecDeque::from([dir.to_owned()]);
    let mut read = 0usize;
    while let Some(d) = queue.pop_front() {
        if read >= MAX_DIRECTORIES {
            listing.truncated = true;
            break;
        }
        read += 1;
        let xml = storage.propfind(&d, &macaroon, MAX_ANSWER_BYTES).await?;
        let entries = parse_multistatus(&xml).map_err(|why| ListError::Malformed { dir: d.clone(), why })?;
        for e in entries {
            let Some(name) = e.path.strip_prefix(d.as_str()).map(|n| n.trim_end_matches('/')) else { continue };
            // The directory itself, or anything that is not one clean segment below it.
            if name.is_empty() || name.contains('/') || !is_clean_abs_path(&format!("{d}{name}")) {
                continue;
            }
            if e.dir {
                queue.push_back(format!("{d}{name}/"));
            } else if listing.files.len() >= max_files {
                listing.truncated = true;
                return Ok(listing);
            } else {
                listing.files.push(Listed { path: format!("{d}{name}"), size: e.size, modified_s: e.modified_s });
            }
        }
    }
    Ok(listing)
}

/// The `response`s of a WebDAV multistatus document (namespace-aware: any prefix of `DAV:`).
pub(crate) fn parse_multistatus(xml: &str) -> Result<Vec<Entry>, String> {
    let mut reader = quick_xml::NsReader::from_str(xml);
    let mut entries = Vec::new();
    let mut current: Option<Entry> = None;
    // The DAV element whose text is being read (`href`, `getcontentlength`, `getlastmodified`).
    let mut field: Option<&'static str> = None;
    let mut text = String::new();
    let mut seen_root = false;
    loop {
        let (ns, event) = reader.read_resolved_event().map_err(|e| e.to_string())?;
        let dav = matches!(ns, ResolveResult::Bound(Namespace(n)) if n == DAV);
        let empty = matches!(event, Event::Empty(_));
        match event {
            Event::Start(e) | Event::Empty(e) if dav => {
                match e.local_name().as_ref() {
                    b"multistatus" => seen_root = true,
                    b"response" => current = Some(Entry::default()),
                    b"collection" => {
                        if let Some(c) = current.as_mut() {
                            c.dir = true;
                        }
                    }
                    b"href" if !empty => field = Some("href"),
                    b"getcontentlength" if !empty => field = Some("getcontentlength"),
                    b"getlastmodified" if !empty => field = Some("getlastmodified"),
                    _ => {}
                }
                text.clear();
            }
            Event::Text(t) if field.is_some() => text.push_str(&t.decode().map_err(|e| e.to_string())?),
            Event::GeneralRef(r) if field.is_some() => {
                let name = r.decode().map_err(|e| e.to_string())?;
                match r.resolve_char_ref().map_err(|e| e.to_string())? {
                    Some(c) => text.push(c),
                    None => text.push_str(
                        quick_xml::escape::resolve_xml_entity(&name)
                            .ok_or_else(|| format!("unknown entity &{name};"))?,
                    ),
                }
            }
            Event::End(e) if dav => {
                let local = e.local_name();
                let local = local.as_ref();
                if let (Some(f), Some(c)) = (field, current.as_mut())
                    && f.as_bytes() == local
                {
                    let value = text.trim();
                    match f {
                        "href" => c.path = href_path(value)?,
                        "getcontentlength" => c.size = value.parse().ok(),
                        _ => {
                            c.modified_s = httpdate::parse_http_date(value)
                                .ok()
                                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                                .map(|d| d.as_secs())
                        }
                    }
                    field = None;
                }
                if local == b"response"
                    && let Some(c) = current.take()
                {
                    entries.push(c);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !seen_root {
        return Err("no DAV: multistatus element".into());
    }
    Ok(entries)
}

/// The decoded path of an href: a path, or a full URL's path.
fn href_path(href: &str) -> Result<String, String> {
    let raw = if href.starts_with('/') {
        href
    } else {
        let after_scheme = href.split_once("://").map(|(_, rest)| rest).ok_or_else(|| format!("href {href:?}"))?;
        after_scheme.find('/').map(|i| &after_scheme[i..]).unwrap_or("/")
    };
    let raw = raw.split(['?', '#']).next().unwrap_or_default();
    htfaas_functions::percent::decode_utf8(raw).ok_or_else(|| format!("href {href:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dcache_style_answer_reads_with_any_prefix_full_urls_and_entities() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<D:multistatus xmlns:D="DAV:" xmlns:ns1="http://www.dcache.org/2013/webdav">
 <D:response><D:href>https://door.example:2880/data/raw/</D:href>
  <D:propstat><D:prop><D:resourcetype><D:collection/></D:resourcetype></D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>
 <D:response><D:href>https://door.example:2880/data/raw/a%20b.dat</D:href>
  <D:propstat><D:prop><D:resourcetype/><D:getcontentlength>12</D:getcontentlength>
  <D:getlastmodified>Thu, 26 Nov 2026 15:00:00 GMT</D:getlastmodified></D:prop></D:propstat></D:response>
 <D:response><D:href>/data/raw/x&amp;y.dat</D:href><D:propstat><D:prop><D:resourcetype/></D:prop></D:propstat></D:response>
 <D:response><D:href>/data/raw/sub/</D:href><D:propstat><D:prop><D:resourcetype><D:collection/></D:resourcetype></D:prop></D:propstat></D:response>
 <other:response xmlns:other="urn:not-dav"><other:href>/data/raw/forged</other:href></other:response>
</D:multistatus>"#;
        let e = parse_multistatus(xml).expect("parses");
        let paths: Vec<(&str, bool)> = e.iter().map(|e| (e.path.as_str(), e.dir)).collect();
        assert_eq!(
            paths,
            [
                ("/data/raw/", true),
                ("/data/raw/a b.dat", false),
                ("/data/raw/x&y.dat", false),
                ("/data/raw/sub/", true)
            ]
        );
        assert_eq!((e[1].size, e[1].modified_s), (Some(12), Some(1_795_705_200)));
        assert_eq!((e[2].size, e[2].modified_s), (None, None));
    }

    #[test]
    fn what_is_no_multistatus_is_refused() {
        for bad in [
            "",
            "<html>not found</html>",
            "<d:multistatus xmlns:d=\"urn:x\"/>",
            "<D:multistatus xmlns:D=\"DAV:\"><D:response><D:href>&bogus;</D:href>",
        ] {
            assert!(parse_multistatus(bad).is_err(), "{bad:?}");
        }
    }
}
