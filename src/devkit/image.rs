//! `htfaas image build`: a native function's image, a Debian root file system made by
//! mmdebstrap with the packages the function needs and the developer's own files, written as
//! one tar whose sha256 is the image's digest. The mount points the sandbox binds (`/input`,
//! `/output`, `/tmp`, `/proc`, `/dev`) are made in it, as a read-only root needs them.
//!
//! mmdebstrap runs as root here (its `root` mode) or, for another user, in its `unshare` mode
//! (user namespaces); either way nothing of the host goes into the image but the `--add` files.

use super::{DevError, io};
use htfaas_functions::Digest;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What an image is built from.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The Debian suite, e.g. `bookworm`.
    pub suite: String,
    /// Debian packages beyond the essential ones (e.g. `python3-numpy`).
    pub packages: Vec<String>,
    /// Host files or directories copied into the image: (host path, absolute image path).
    pub add: Vec<(PathBuf, String)>,
    /// The mirror, when not Debian's default.
    pub mirror: Option<String>,
    /// A base image (a plain tar, e.g. one `image build` made, or the site's) to add the
    /// files to instead of building a root: fast, and no network.
    pub from: Option<PathBuf>,
}

/// A built image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// The tar.
    pub file: PathBuf,
    /// Its digest.
    pub digest: Digest,
    /// Its size, bytes.
    pub size: u64,
}

/// Parses `--add SRC:DEST` (DEST absolute, without `..`).
pub fn parse_add(s: &str) -> Result<(PathBuf, String), String> {
    let (src, dest) = s.rsplit_once(':').ok_or("want SRC:DEST, e.g. ./app:/opt/app")?;
    if !htfaas_functions::manifest::is_clean_abs_path(dest) || dest == "/" {
        return Err(format!("{dest:?}: DEST must be an absolute path below /, without . or .."));
    }
    Ok((PathBuf::from(src), dest.trim_end_matches('/').to_owned()))
}

/// Builds `spec` into `out` with `mmdebstrap` (the program at that path or on `PATH`), or,
/// `from` a base, by appending the files to a copy of it (GNU tar).
pub fn build_image(spec: &ImageSpec, out: &Path, mmdebstrap: &Path) -> Result<BuiltImage, DevError> {
    for (src, _) in &spec.add {
        if !src.exists() {
            return Err(DevError::Io {
                what: format!("--add {}", src.display()),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            });
        }
    }
    if let Some(base) = &spec.from {
        return add_to_base(base, &spec.add, out);
    }
    let mut cmd = Command::new(mmdebstrap);
    cmd.arg("--variant=essential").arg("--format=tar").arg("--quiet");
    if !spec.packages.is_empty() {
        cmd.arg(format!("--include={}", spec.packages.join(",")));
    }
    // The sandbox's mount points, then the developer's files (each into its parent directory,
    // made first: `copy-in` copies a path into a directory of the image).
    cmd.arg("--customize-hook=mkdir -p \"$1/input\" \"$1/output\" \"$1/tmp\" \"$1/proc\" \"$1/dev\"");
    for (src, dest) in &spec.add {
        let src = std::fs::canonicalize(src).map_err(io(format!("--add {}", src.display())))?;
        let (parent, name) = dest.rsplit_once('/').unwrap_or(("", dest));
        let parent = if parent.is_empty() { "/" } else { parent };
        let staged = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        cmd.arg(format!("--customize-hook=mkdir -p \"$1{parent}\""));
        cmd.arg(format!("--customize-hook=copy-in {} {parent}", shell_word(&src.display().to_string())));
        if staged != name {
            cmd.arg(format!("--customize-hook=mv \"$1{parent}/{staged}\" \"$1{dest}\""));
        }
    }
    // Reproducible enough to compare: no apt lists or caches in the image.
    cmd.arg("--customize-hook=rm -rf \"$1/var/lib/apt/lists\"/* \"$1/var/cache/apt\"/*");
    cmd.arg(&spec.suite).arg(out);
    if let Some(m) = &spec.mirror {
        cmd.arg(m);
    }
    let output = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            DevError::ToolMissing { tool: "mmdebstrap".into(), hint: "install it (apt-get install mmdebstrap)".into() }
        }
        _ => DevError::Io { what: "run mmdebstrap".into(), source: e },
    })?;
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
        let tail: String = text.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(DevError::BuildFailed {
            tool: "mmdebstrap".into(),
            status: output.status.to_string(),
            output: tail,
        });
    }
    let (digest, size) = digest_of_file(out)?;
    Ok(BuiltImage { file: out.to_owned(), digest, size })
}

/// `base` with `add` appended (owned by root, readable by all), written to `out`.
fn add_to_base(base: &Path, add: &[(PathBuf, String)], out: &Path) -> Result<BuiltImage, DevError> {
    let mut head = [0u8; 2];
    let mut f = std::fs::File::open(base).map_err(io(format!("open {}", base.display())))?;
    std::io::Read::read_exact(&mut f, &mut head).map_err(io(format!("read {}", base.display())))?;
    if head == [0x1f, 0x8b] {
        return Err(DevError::Io {
            what: format!("--from {}", base.display()),
            source: std::io::Error::other("a gzip'd base cannot be added to; give the plain tar"),
        });
    }
    std::fs::copy(base, out).map_err(io(format!("copy {} to {}", base.display(), out.display())))?;
    // The files are staged under their image paths, then appended from the top directories.
    let stage = tempfile::tempdir().map_err(io("make a staging directory"))?;
    let mut tops = std::collections::BTreeSet::new();
    for (src, dest) in add {
        let target = stage.path().join(dest.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("stage {dest}")))?;
        }
        run("cp", std::process::Command::new("cp").arg("-a").arg(src).arg(&target))?;
        tops.insert(dest.trim_start_matches('/').split('/').next().unwrap_or_default().to_owned());
    }
    if !tops.is_empty() {
        let mut tar = std::process::Command::new("tar");
        tar.args(["--append", "--owner=0", "--group=0", "--numeric-owner", "--mode=a+rX,go-w", "-f"])
            .arg(out)
            .arg("-C")
            .arg(stage.path())
            .args(&tops);
        run("tar", &mut tar)?;
    }
    let (digest, size) = digest_of_file(out)?;
    Ok(BuiltImage { file: out.to_owned(), digest, size })
}

/// Runs `cmd`, its failure an error naming `tool` with its stderr.
fn run(tool: &str, cmd: &mut std::process::Command) -> Result<(), DevError> {
    let output = cmd.output().map_err(io(format!("run {tool}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(DevError::BuildFailed {
        tool: tool.into(),
        status: output.status.to_string(),
        output: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// The digest and size of the file at `path`, read in blocks.
pub fn digest_of_file(path: &Path) -> Result<(Digest, u64), DevError> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).map_err(io(format!("open {}", path.display())))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(format!("read {}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((Digest::from_hasher(hasher), size))
}

/// `s` quoted for the shell mmdebstrap runs its hooks with.
fn shell_word(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_takes_a_source_and_a_clean_absolute_destination() {
        assert_eq!(parse_add("./app:/opt/app/").expect("ok"), (PathBuf::from("./app"), "/opt/app".to_owned()));
        assert_eq!(parse_add("C:/x:/opt/x").expect("last colon splits").1, "/opt/x");
        for bad in ["./app", "./app:opt/app", "./app:/opt/../etc", "./app:/"] {
            assert!(parse_add(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shell_words_survive_quotes() {
        assert_eq!(shell_word("/a b/it's"), "'/a b/it'\\''s'");
    }
}
