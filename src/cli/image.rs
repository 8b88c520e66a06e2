//! `htfaas image build|push|list|show|delete`: native functions' images. Must not know: how an
//! EP unpacks or runs one.

use super::args::{DirArg, client};
use anyhow::Context as _;
use clap::Subcommand;
use htfaas::devkit::{ImageSpec, build_image, parse_add};
use htfaas_functions::Digest;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ImageCommand {
    /// Build an image with mmdebstrap (a Debian root with the packages named and your files),
    /// write it as a tar and push it (unless --no-push), printing its digest.
    Build {
        #[command(flatten)]
        dir: DirArg,
        /// Debian suite.
        #[arg(long, default_value = "bookworm")]
        debian: String,
        /// Debian packages, comma-separated (e.g. python3-numpy,python3-h5py).
        #[arg(long, value_delimiter = ',')]
        packages: Vec<String>,
        /// A host file or directory copied into the image, SRC:DEST (repeatable), e.g.
        /// ./app:/opt/app.
        #[arg(long = "add", value_name = "SRC:DEST", value_parser = parse_add)]
        add: Vec<(PathBuf, String)>,
        /// A name of yours for it, for `fn register --image NAME`.
        #[arg(long)]
        tag: Option<String>,
        /// Where the tar goes (default: TAG.tar, or image.tar).
        #[arg(long)]
        out: Option<PathBuf>,
        /// A Debian mirror instead of the default.
        #[arg(long)]
        mirror: Option<String>,
        /// Add the --add files to this base image (a plain tar) instead of building a root
        /// (no mmdebstrap, no network; --debian and --packages do not apply).
        #[arg(long, conflicts_with = "packages")]
        from: Option<PathBuf>,
        /// Only build: do not push.
        #[arg(long)]
        no_push: bool,
    },
    /// Push an image into the gateway's store, counted against your module quota: a tar (plain
    /// or gzip'd; e.g. from `image build --no-push` or your own mmdebstrap), or an unpacked root
    /// directory (tarred here, owned by root).
    Push {
        #[command(flatten)]
        dir: DirArg,
        /// The tar, or a root directory.
        file: PathBuf,
        /// A name of yours for it.
        #[arg(long)]
        tag: Option<String>,
    },
    /// Your images, newest first.
    List {
        #[command(flatten)]
        dir: DirArg,
    },
    /// One image (by digest or tag): size, tags, and the function versions that use it.
    Show {
        #[command(flatten)]
        dir: DirArg,
        /// Digest or tag.
        image: String,
    },
    /// Delete one of your images; refused while a function version names it.
    Delete {
        #[command(flatten)]
        dir: DirArg,
        /// Digest or tag.
        image: String,
    },
}

/// `htfaas image …`.
pub async fn run(command: ImageCommand) -> anyhow::Result<()> {
    match command {
        ImageCommand::Build { dir, debian, packages, add, tag, out, mirror, from, no_push } => {
            let out = out.unwrap_or_else(|| PathBuf::from(format!("{}.tar", tag.as_deref().unwrap_or("image"))));
            if from.is_none() {
                eprintln!("building {} with mmdebstrap (a minute or more) ...", out.display());
            }
            let spec = ImageSpec { suite: debian, packages, add, mirror, from };
            let target = out.clone();
            let built =
                tokio::task::spawn_blocking(move || build_image(&spec, &target, std::path::Path::new("mmdebstrap")))
                    .await
                    .context("build task")??;
            println!("built {} ({} bytes): {}", built.file.display(), built.size, built.digest);
            if !no_push {
                let digest = client(&dir)?.push_image(&built.file, tag.as_deref()).await?;
                println!("pushed {digest}{}", tag.map(|t| format!(" as {t}")).unwrap_or_default());
            }
            Ok(())
        }
        ImageCommand::Push { dir, file, tag } => {
            let client = client(&dir)?;
            let staged = tempfile::tempdir().context("a temporary directory")?;
            let file = if file.is_dir() { tar_directory(&file, staged.path()).await? } else { file };
            let digest = client.push_image(&file, tag.as_deref()).await?;
            println!("{digest}");
            Ok(())
        }
        ImageCommand::List { dir } => {
            let images = client(&dir)?.images().await?;
            if images.is_empty() {
                println!("no images");
            }
            for i in images {
                let tags = if i.tags.is_empty() { String::new() } else { format!("  tags: {}", i.tags.join(",")) };
                let used =
                    if i.used_by.is_empty() { String::new() } else { format!("  used by: {}", i.used_by.join(", ")) };
                println!("{}  {:>12} bytes{tags}{used}", i.digest, i.size);
            }
            Ok(())
        }
        ImageCommand::Show { dir, image } => {
            let info = client(&dir)?.image(&image).await?;
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(())
        }
        ImageCommand::Delete { dir, image } => {
            let client = client(&dir)?;
            let digest: Digest = client.resolve_image(&image).await?;
            client.delete_image(&digest).await?;
            println!("deleted {digest}");
            Ok(())
        }
    }
}

/// `root` as a tar in `into` (entries owned by root, relative to `root`).
async fn tar_directory(root: &std::path::Path, into: &std::path::Path) -> anyhow::Result<PathBuf> {
    let tar = into.join("image.tar");
    let out = tokio::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .args(["--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(root)
        .arg(".")
        .output()
        .await
        .context("run tar")?;
    if !out.status.success() {
        anyhow::bail!("tar {}: {}", root.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(tar)
}
