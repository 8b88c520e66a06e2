//! Images of native functions: root filesystem tars stored by content digest beside the wasm
//! modules (`<dir>/images/<hex>.tar`), uploaded by streaming into a file of the registry's own
//! ([`Registry::image_upload`]: never whole in memory), counted against the uploader's
//! [`ModuleQuota`] with its modules, named by per-owner tags, and kept while any function
//! version names them: versions are immutable and every job's lineage names its version, so an
//! image a version or a job used is never deleted.
//!
//! What is checked here is only that the bytes look like a tar (plain or gzip'd): every EP
//! checks each entry when it unpacks one (`ep::native::image`).
//!
//! Must not know: HTTP, EPs, how an image is unpacked or run.

use super::{ModuleQuota, Registry, RegistryError};
use crate::digest::Digest;
pub use crate::proto::ImageInfo;
use rusqlite::{Connection, OptionalExtension, params};
use sha2::Digest as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Largest image accepted, bytes (a Debian root with numpy is ~250 MB).
pub const MAX_IMAGE_BYTES: u64 = 8 << 30;

/// An upload in progress: a private file in the images directory (its rename into place is
/// atomic), hashed and counted as it is written. Dropped without [`Registry::put_image`], the
/// file is removed.
#[derive(Debug)]
pub struct ImageUpload {
    path: PathBuf,
    file: Option<std::fs::File>,
    hasher: sha2::Sha256,
    size: u64,
    head: Vec<u8>,
}

impl ImageUpload {
    /// Appends `chunk`; refuses past [`MAX_IMAGE_BYTES`].
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), RegistryError> {
        self.size = self.size.saturating_add(chunk.len() as u64);
        if self.size > MAX_IMAGE_BYTES {
            return Err(RegistryError::NotImage(format!("larger than {MAX_IMAGE_BYTES} bytes")));
        }
        if self.head.len() < 512 {
            let take = (512 - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
        }
        self.hasher.update(chunk);
        match &mut self.file {
            Some(f) => f.write_all(chunk).map_err(RegistryError::Io),
            None => Err(RegistryError::Io(std::io::Error::other("the upload was finished"))),
        }
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for ImageUpload {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `head` (an image's first bytes) starts a gzip stream or a tar archive (ustar or
/// old-style: a header block whose checksum adds up).
fn looks_like_tar(head: &[u8]) -> bool {
    if head.starts_with(&[0x1f, 0x8b]) {
        return true;
    }
    if head.len() < 512 {
        return false;
    }
    if &head[257..262] == b"ustar" {
        return true;
    }
    let stored = std::str::from_utf8(&head[148..156])
        .ok()
        .map(|s| s.trim_matches(|c: char| c == '\0' || c == ' '))
        .and_then(|s| u32::from_str_radix(s, 8).ok());
    let sum: u32 =
        head[..512].iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
    stored == Some(sum)
}

pub(super) fn create_tables(conn: &Connection) -> Result<(), RegistryError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS images (
             digest TEXT PRIMARY KEY, size INTEGER NOT NULL, stored_at INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS image_tags (
             owner TEXT NOT NULL, tag TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (owner, tag));",
    )?;
    Ok(())
}

impl Registry {
    fn image_dir(&self) -> PathBuf {
        self.blob_dir.with_file_name("images")
    }

    fn image_file(&self, digest: &Digest) -> PathBuf {
        self.image_dir().join(format!("{}.tar", digest.hex()))
    }

    /// Starts an upload: a new private file in the images directory.
    pub fn image_upload(&self) -> Result<ImageUpload, RegistryError> {
        let dir = self.image_dir();
        crate::store::create_private_dir(&dir)?;
        let path = dir.join(format!(".upload-{}.tmp", uuid::Uuid::new_v4()));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        Ok(ImageUpload { path, file: Some(file), hasher: sha2::Sha256::new(), size: 0, head: Vec::new() })
    }

    /// Stores a finished upload as `owner`'s (`None`: an admin's, counted against no quota),
    /// tagged `tag` when given, and returns its digest. Refused: bytes that are no tar
    /// ([`RegistryError::NotImage`]), an upload past the owner's quota (modules and images
    /// together); an image stored before is answered again.
    pub fn put_image(
        &self,
        owner: Option<&str>,
        mut upload: ImageUpload,
        quota: ModuleQuota,
        tag: Option<&str>,
    ) -> Result<Digest, RegistryError> {
        if !looks_like_tar(&upload.head) {
            return Err(RegistryError::NotImage("neither a tar archive nor a gzip'd one".into()));
        }
        if let Some(t) = tag {
            crate::manifest::check_name(t).map_err(|e| RegistryError::NotImage(format!("tag: {e}")))?;
        }
        let Some(file) = upload.file.take() else {
            return Err(RegistryError::Io(std::io::Error::other("the upload was finished")));
        };
        file.sync_all()?;
        drop(file);
        let digest = Digest::from_hasher(std::mem::take(&mut upload.hasher));
        let size = upload.size;
        if let Some(owner) = owner {
            self.reserve(owner, &digest, size, quota, "images and modules")?;
        }
        let stored = self.image_file(&digest);
        let placed = if stored.exists() { Ok(()) } else { std::fs::rename(&upload.path, &stored) };
        if let Err(e) = placed {
            if let Some(owner) = owner {
                self.unreserve(owner, &digest);
            }
            return Err(e.into());
        }
        let conn = self.conn();
        conn.execute(
            "INSERT OR IGNORE INTO images (digest, size, stored_at) VALUES (?1, ?2, ?3)",
            params![digest.as_str(), i64::try_from(size).unwrap_or(i64::MAX), crate::time::now_s() as i64],
        )?;
        if let Some(t) = tag {
            conn.execute(
                "INSERT OR REPLACE INTO image_tags (owner, tag, digest) VALUES (?1, ?2, ?3)",
                params![owner.unwrap_or(""), t, digest.as_str()],
            )?;
        }
        Ok(digest)
    }

    /// Path of a stored image, if it is stored.
    pub fn image_path(&self, digest: &Digest) -> Result<Option<PathBuf>, RegistryError> {
        let known: Option<i64> = self
            .conn()
            .query_row("SELECT size FROM images WHERE digest = ?1", [digest.as_str()], |r| r.get(0))
            .optional()?;
        Ok(known.map(|_| self.image_file(digest)))
    }

    /// The image `owner` tagged `tag` (an admin's tags are under the owner `""`).
    pub fn image_by_tag(&self, owner: &str, tag: &str) -> Result<Option<Digest>, RegistryError> {
        let d: Option<String> = self
            .conn()
            .query_row("SELECT digest FROM image_tags WHERE owner = ?1 AND tag = ?2", params![owner, tag], |r| r.get(0))
            .optional()?;
        d.map(|d| d.parse().map_err(|e| RegistryError::Corrupt(format!("image tag {tag}: {e}")))).transpose()
    }

    /// The images `owner` uploaded (`None`: every image), newest first, with `owner`'s tags.
    pub fn images(&self, owner: Option<&str>) -> Result<Vec<ImageInfo>, RegistryError> {
        let digests: Vec<String> = {
            let conn = self.conn();
            let mut stmt = conn.prepare(
                "SELECT i.digest FROM images i WHERE ?1 IS NULL OR EXISTS \
                 (SELECT 1 FROM module_uploads u WHERE u.owner = ?1 AND u.digest = i.digest) \
                 ORDER BY i.stored_at DESC, i.digest",
            )?;
            stmt.query_map([owner], |r| r.get(0))?.collect::<Result<_, _>>()?
        };
        digests
            .iter()
            .filter_map(|d| d.parse::<Digest>().ok())
            .filter_map(|d| self.image(owner, &d).transpose())
            .collect()
    }

    /// One image, with `owner`'s tags for it and every version that names it; `None` when it
    /// is not stored, or `owner` (`None`: an admin, any image) never uploaded it.
    pub fn image(&self, owner: Option<&str>, digest: &Digest) -> Result<Option<ImageInfo>, RegistryError> {
        let conn = self.conn();
        let row: Option<(i64, i64)> = conn
            .query_row(
                "SELECT i.size, i.stored_at FROM images i WHERE i.digest = ?1 AND (?2 IS NULL OR EXISTS \
                 (SELECT 1 FROM module_uploads u WHERE u.owner = ?2 AND u.digest = i.digest))",
                params![digest.as_str(), owner],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((size, stored_at)) = row else { return Ok(None) };
        let mut stmt = conn.prepare("SELECT tag FROM image_tags WHERE owner = ?1 AND digest = ?2 ORDER BY tag")?;
        let tags =
            stmt.query_map(params![owner.unwrap_or(""), digest.as_str()], |r| r.get(0))?.collect::<Result<_, _>>()?;
        let used_by = used_by(&conn, digest)?;
        Ok(Some(ImageInfo {
            digest: digest.clone(),
            size: u64::try_from(size).unwrap_or(0),
            stored_at: u64::try_from(stored_at).unwrap_or(0),
            tags,
            used_by,
        }))
    }

    /// Deletes `owner`'s upload of `digest` (`None`: an admin's, anyone's) and its tags; the
    /// file goes once no owner holds it. Refused while a function version names it
    /// ([`RegistryError::InUse`]); `false` when `owner` has no such image.
    pub fn delete_image(&self, owner: Option<&str>, digest: &Digest) -> Result<bool, RegistryError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let used = used_by(&tx, digest)?;
        if !used.is_empty() {
            return Err(RegistryError::InUse(format!("image {digest} is named by {}", used.join(", "))));
        }
        let mine = match owner {
            Some(o) => {
                tx.execute("DELETE FROM module_uploads WHERE owner = ?1 AND digest = ?2", params![o, digest.as_str()])?
                    == 1
            }
            None => {
                tx.execute("DELETE FROM module_uploads WHERE digest = ?1", [digest.as_str()])?;
                tx.query_row("SELECT EXISTS (SELECT 1 FROM images WHERE digest = ?1)", [digest.as_str()], |r| r.get(0))?
            }
        };
        if !mine {
            return Ok(false);
        }
        tx.execute(
            "DELETE FROM image_tags WHERE digest = ?1 AND (?2 IS NULL OR owner = ?2)",
            params![digest.as_str(), owner],
        )?;
        let held: bool =
            tx.query_row("SELECT EXISTS (SELECT 1 FROM module_uploads WHERE digest = ?1)", [digest.as_str()], |r| {
                r.get(0)
            })?;
        if !held {
            tx.execute("DELETE FROM images WHERE digest = ?1", [digest.as_str()])?;
        }
        tx.commit()?;
        if !held {
            remove_quietly(&self.image_file(digest));
        }
        Ok(true)
    }
}

/// Every version (`name@version`) whose manifest names `digest`.
fn used_by(conn: &Connection, digest: &Digest) -> Result<Vec<String>, RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT name, version FROM functions WHERE json_extract(record, '$.manifest.module') = ?1 \
         ORDER BY name, version",
    )?;
    let rows =
        stmt.query_map([digest.as_str()], |r| Ok(format!("{}@{}", r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn remove_quietly(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("failed to remove image file {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        // A minimal ustar: one header block per file, the data padded to 512, two zero blocks.
        let mut out = Vec::new();
        for (name, data) in files {
            let mut h = [0u8; 512];
            h[..name.len()].copy_from_slice(name.as_bytes());
            h[100..107].copy_from_slice(b"0000644");
            h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
            h[156] = b'0';
            h[257..263].copy_from_slice(b"ustar\0");
            h[263..265].copy_from_slice(b"00");
            h[148..156].copy_from_slice(b"        ");
            let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
            h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
            out.extend_from_slice(&h);
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    fn upload(reg: &Registry, bytes: &[u8]) -> ImageUpload {
        let mut up = reg.image_upload().expect("upload");
        for chunk in bytes.chunks(1000) {
            up.write(chunk).expect("write");
        }
        up
    }

    /// An image is stored by the digest of its bytes, counted against its owner's quota, found
    /// by its tag, kept while a version names it, and removed with its file once deleted.
    #[test]
    fn images_are_stored_tagged_counted_and_kept_while_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let image = tar_of(&[("bin/tool", b"#!/bin/sh\necho hi\n")]);
        let quota = ModuleQuota::default();
        let d = reg.put_image(Some("alice"), upload(&reg, &image), quota, Some("tools")).expect("stored");
        assert_eq!(d, Digest::of(&image));
        let path = reg.image_path(&d).expect("path").expect("stored");
        assert_eq!(std::fs::read(&path).expect("read"), image);
        assert_eq!(reg.image_by_tag("alice", "tools").expect("tag"), Some(d.clone()));
        assert_eq!(reg.image_by_tag("bob", "tools").expect("tag"), None, "tags are per owner");
        assert_eq!(reg.images(Some("alice")).expect("list").len(), 1);
        assert!(reg.images(Some("bob")).expect("list").is_empty(), "bob uploaded none");
        let leftovers = std::fs::read_dir(dir.path().join("images")).expect("dir").count();
        assert_eq!(leftovers, 1, "no temporary file is left");

        let mut m = super::super::tests::manifest(d.clone());
        m.runtime = crate::manifest::RuntimeKind::Native;
        m.command = vec!["/bin/tool".into()];
        reg.register(m).expect("a native function names the image");
        let e = reg.delete_image(Some("alice"), &d).expect_err("in use");
        assert!(matches!(e, RegistryError::InUse(_)), "{e}");
        assert_eq!(reg.image(Some("alice"), &d).expect("show").expect("kept").used_by, vec!["checksum@1"]);
        assert!(reg.image(Some("bob"), &d).expect("show").is_none(), "not bob's to see");

        let other = tar_of(&[("x", b"y")]);
        let d2 = reg.put_image(Some("alice"), upload(&reg, &other), quota, None).expect("stored");
        assert!(!reg.delete_image(Some("bob"), &d2).expect("bob's delete"), "not bob's to delete");
        assert!(reg.delete_image(Some("alice"), &d2).expect("delete"));
        assert!(reg.image_path(&d2).expect("path").is_none());
        assert!(!reg.image_file(&d2).exists(), "the file is gone");
    }

    /// Bytes that are no tar, an owner past its quota, and a native manifest naming an image
    /// never uploaded are refused, and nothing is left behind.
    #[test]
    fn what_is_not_an_image_or_past_the_quota_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::open(dir.path()).expect("open");
        let quota = ModuleQuota { max_modules: 10, max_bytes: 4096 };
        let e = reg.put_image(Some("alice"), upload(&reg, &[7u8; 2048]), quota, None).expect_err("not a tar");
        assert!(matches!(e, RegistryError::NotImage(_)), "{e}");
        let big = tar_of(&[("big", &[1u8; 5000])]);
        let e = reg.put_image(Some("alice"), upload(&reg, &big), quota, None).expect_err("past the quota");
        assert!(matches!(e, RegistryError::QuotaExceeded(_)), "{e}");
        assert_eq!(std::fs::read_dir(dir.path().join("images")).expect("dir").count(), 0, "nothing left");
        let mut m = super::super::tests::manifest(Digest::of(b"never uploaded"));
        m.runtime = crate::manifest::RuntimeKind::Native;
        m.command = vec!["/bin/true".into()];
        let e = reg.register(m).expect_err("unknown image");
        assert!(matches!(e, RegistryError::UnknownModule(_)), "{e}");
    }
}
