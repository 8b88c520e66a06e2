//! Native functions' images at the gateway: push (streamed from a file), list, show, delete,
//! with the profile's token (a developer's own images, an admin's all). Must not know: how
//! they are printed or built.

use super::{Client, check};
use anyhow::Context as _;
use htfaas_functions::Digest;
use htfaas_functions::proto::{ImageInfo, ModuleUploaded};
use std::path::Path;

impl Client {
    /// Streams the image tar at `file` to the gateway (tagged `tag` when given); its digest.
    pub async fn push_image(&self, file: &Path, tag: Option<&str>) -> anyhow::Result<Digest> {
        let f = tokio::fs::File::open(file).await.with_context(|| format!("open {}", file.display()))?;
        let len = f.metadata().await.map(|m| m.len()).ok();
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024));
        let mut url = reqwest::Url::parse(&self.gateway("/v1/images")).context("gateway URL")?;
        if let Some(t) = tag {
            url.query_pairs_mut().append_pair("tag", t);
        }
        let mut req = self.http.post(url).bearer_auth(&self.info.admin_token).body(body);
        if let Some(len) = len {
            req = req.header(reqwest::header::CONTENT_LENGTH, len);
        }
        let resp = req.send().await?;
        Ok(check(resp, "push image").await?.json::<ModuleUploaded>().await?.digest)
    }

    /// The caller's images (an admin's: all), newest first.
    pub async fn images(&self) -> anyhow::Result<Vec<ImageInfo>> {
        let resp = self.http.get(self.gateway("/v1/images")).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, "list images").await?.json().await?)
    }

    /// One of the caller's images, by digest or by one of its tags.
    pub async fn image(&self, digest_or_tag: &str) -> anyhow::Result<ImageInfo> {
        // A digest or a tag (a name's syntax) is one clean path segment as it is.
        if digest_or_tag.parse::<Digest>().is_err() {
            htfaas_functions::manifest::check_name(digest_or_tag).map_err(|e| anyhow::anyhow!("image tag: {e}"))?;
        }
        let path = format!("/v1/images/{digest_or_tag}/info");
        let resp = self.http.get(self.gateway(&path)).bearer_auth(&self.info.admin_token).send().await?;
        Ok(check(resp, &format!("show image {digest_or_tag}")).await?.json().await?)
    }

    /// Deletes the caller's upload of `digest`.
    pub async fn delete_image(&self, digest: &Digest) -> anyhow::Result<()> {
        let resp = self
            .http
            .delete(self.gateway(&format!("/v1/images/{digest}")))
            .bearer_auth(&self.info.admin_token)
            .send()
            .await?;
        check(resp, &format!("delete image {digest}")).await?;
        Ok(())
    }

    /// The digest `digest_or_tag` names: itself when it is one, else the caller's tag.
    pub async fn resolve_image(&self, digest_or_tag: &str) -> anyhow::Result<Digest> {
        match digest_or_tag.parse::<Digest>() {
            Ok(d) => Ok(d),
            Err(_) => Ok(self.image(digest_or_tag).await?.digest),
        }
    }
}
