//! `htfaas put` and `htfaas get`: a file into and out of the stack's storage. Must not know:
//! anything but the storage paths and bytes.

use super::args::{DirArg, client};
use std::path::PathBuf;

// The arguments of `htfaas put`.
#[derive(clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Local file.
    pub local: PathBuf,
    /// Storage path, e.g. /data/raw/run1.dat.
    pub storage_path: String,
}

// The arguments of `htfaas get`.
#[derive(clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Storage path.
    pub storage_path: String,
}

/// `htfaas put LOCAL STORAGE_PATH`.
pub async fn put(args: PutArgs) -> anyhow::Result<()> {
    let PutArgs { dir, local, storage_path } = args;
    client(&dir)?.put_file(&local, &storage_path).await
}

/// `htfaas get STORAGE_PATH`: the file's bytes to stdout.
pub async fn get(args: GetArgs) -> anyhow::Result<()> {
    let GetArgs { dir, storage_path } = args;
    client(&dir)?.get_to(&storage_path, &mut tokio::io::stdout()).await
}
