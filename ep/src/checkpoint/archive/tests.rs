//! The checkpoint archive's rules: a packed tree gives the same bytes again, and unpacking
//! refuses every entry that could write outside `/checkpoint` or past its bound.

use super::*;

/// A tar holding one entry of `kind` named `name` exactly as given (raw header bytes: the tar
/// crate's own setters refuse such names), with `data`; a link's target is `target`.
fn raw_tar(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, target) in entries {
        let mut h = tar::Header::new_old();
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        raw.linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, *data).expect("append");
    }
    b.into_inner().expect("finish")
}

/// Unpacks `tar` into `<tmp>/a/checkpoint`, bounded by `max`; `<tmp>` is returned to look
/// around what it left outside.
fn unpack_bytes(tar: &[u8], max: u64) -> (tempfile::TempDir, Result<Unpacked, ArchiveError>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(tmp.path().join("a")).expect("mkdir");
    let file = tmp.path().join("a/checkpoint.tar");
    std::fs::write(&file, tar).expect("write");
    let got = unpack(&file, &tmp.path().join("a/checkpoint"), max);
    (tmp, got)
}

/// Every path under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            out.push(p.strip_prefix(dir).expect("under").display().to_string());
            if std::fs::symlink_metadata(&p).expect("meta").is_dir() {
                pending.push(p);
            }
        }
    }
    out.sort();
    out
}

fn sample(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub/deeper")).expect("mkdir");
    std::fs::write(dir.join("n"), b"42\n").expect("write");
    std::fs::write(dir.join("sub/state.bin"), vec![7u8; 70_000]).expect("write");
    std::fs::write(dir.join("sub/deeper/z"), b"").expect("write");
    let long = "x".repeat(150);
    std::fs::write(dir.join(&long), b"a long name").expect("write");
}

#[test]
fn the_same_tree_packs_to_the_same_bytes_and_round_trips() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    // The same content, made in another order at other times with other modes.
    sample(&a);
    std::fs::create_dir_all(b.join("sub/deeper")).expect("mkdir");
    std::fs::write(b.join("sub/deeper/z"), b"").expect("write");
    std::fs::write(b.join("x".repeat(150)), b"a long name").expect("write");
    std::fs::write(b.join("sub/state.bin"), vec![7u8; 70_000]).expect("write");
    let long_ago = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let f = std::fs::File::options().write(true).open(b.join("sub/state.bin")).expect("open");
    f.set_times(std::fs::FileTimes::new().set_modified(long_ago)).expect("set the time");
    std::fs::write(b.join("n"), b"42\n").expect("write");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(b.join("n"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let pa = pack(&a, &tmp.path().join("a.tar"), 1 << 20).expect("pack a");
    let pb = pack(&b, &tmp.path().join("b.tar"), 1 << 20).expect("pack b");
    assert_eq!(pa.sha256, pb.sha256, "same tree, same sha256");
    assert_eq!(pa.bytes, std::fs::metadata(tmp.path().join("a.tar")).expect("meta").len());
    let bytes = std::fs::read(tmp.path().join("a.tar")).expect("read");
    assert_eq!(hex::encode(Sha256::digest(&bytes)), pa.sha256, "the sha256 is the file's");
    // Another state, another sha256.
    std::fs::write(b.join("n"), b"43\n").expect("write");
    assert_ne!(pack(&b, &tmp.path().join("b.tar"), 1 << 20).expect("pack").sha256, pa.sha256);

    let c = tmp.path().join("c");
    let done = unpack(&tmp.path().join("a.tar"), &c, 1 << 20).expect("unpack");
    assert_eq!(tree(&c), tree(&a));
    assert_eq!(std::fs::read(c.join("sub/state.bin")).expect("read").len(), 70_000);
    assert_eq!(done.bytes, 3 + 70_000 + 11);
    // And packs back to the very same bytes.
    assert_eq!(pack(&c, &tmp.path().join("c.tar"), 1 << 20).expect("pack c").sha256, pa.sha256);
}

#[test]
fn an_empty_directory_packs_to_an_empty_archive() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(tmp.path().join("e")).expect("mkdir");
    let p = pack(&tmp.path().join("e"), &tmp.path().join("e.tar"), 1 << 20).expect("pack");
    assert_eq!(p.bytes, 1024, "two zero blocks");
    let done = unpack(&tmp.path().join("e.tar"), &tmp.path().join("back"), 1 << 20).expect("unpack");
    assert_eq!(done, Unpacked::default());
}

#[test]
fn packing_follows_no_link_and_stops_at_its_bound() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::write(tmp.path().join("secret"), b"the host's").expect("write");
    std::os::unix::fs::symlink(tmp.path().join("secret"), src.join("link")).expect("symlink");
    std::os::unix::fs::symlink(tmp.path(), src.join("dirlink")).expect("symlink");
    std::fs::write(src.join("n"), b"1").expect("write");
    let p = pack(&src, &tmp.path().join("s.tar"), 1 << 20).expect("pack");
    assert_eq!(p.skipped.len(), 2, "{:?}", p.skipped);
    let back = tmp.path().join("back");
    unpack(&tmp.path().join("s.tar"), &back, 1 << 20).expect("unpack");
    assert_eq!(tree(&back), ["n"], "only the regular file went in");

    std::fs::write(src.join("big"), vec![1u8; 10_000]).expect("write");
    let err = pack(&src, &tmp.path().join("s.tar"), 4096).expect_err("over its bound");
    assert!(matches!(err, ArchiveError::OverBound { max: 4096 }), "{err}");
    assert_eq!(err.to_string(), "the checkpoint is over its bound of 4096 bytes");
}

#[test]
fn hostile_archives_are_refused_and_nothing_lands_outside() {
    use tar::EntryType as T;
    let cases: [(&str, Vec<u8>, &str); 8] = [
        ("escape", raw_tar(&[("../escape", T::Regular, b"out", "")]), "a path with `..`"),
        ("deep escape", raw_tar(&[("d/../../escape", T::Regular, b"out", "")]), "a path with `..`"),
        ("absolute", raw_tar(&[("/tmp/abs-escape", T::Regular, b"out", "")]), "an absolute path"),
        ("symlink", raw_tar(&[("link", T::Symlink, b"", "/etc/passwd")]), "a symbolic link"),
        ("hard link", raw_tar(&[("f", T::Regular, b"x", ""), ("h", T::Link, b"", "f")]), "a hard link"),
        ("device", raw_tar(&[("dev", T::Char, b"", "")]), "a device"),
        ("fifo", raw_tar(&[("p", T::Fifo, b"", "")]), "a fifo"),
        ("twice", raw_tar(&[("f", T::Regular, b"x", ""), ("f", T::Regular, b"y", "")]), "already taken"),
    ];
    for (what, tar, why) in cases {
        let (tmp, got) = unpack_bytes(&tar, 1 << 20);
        let err = got.expect_err(what);
        assert!(err.to_string().contains(why), "{what}: {err}");
        assert_eq!(tree(tmp.path()).iter().filter(|p| !p.starts_with("a")).count(), 0, "{what}: wrote outside");
        assert!(!tmp.path().join("escape").exists() && !Path::new("/tmp/abs-escape").exists(), "{what}");
        let inside = tree(&tmp.path().join("a"));
        assert!(inside.iter().all(|p| p == "checkpoint.tar" || p.starts_with("checkpoint")), "{what}: {inside:?}");
    }
}

#[test]
fn a_symlink_packed_by_someone_else_is_never_followed_by_a_later_entry() {
    use tar::EntryType as T;
    // A link first (refused at once), so the file through it is never reached.
    let tar = raw_tar(&[("d", T::Symlink, b"", ".."), ("d/escape", T::Regular, b"out", "")]);
    let (tmp, got) = unpack_bytes(&tar, 1 << 20);
    assert!(got.is_err());
    assert!(!tmp.path().join("a/escape").exists() && !tmp.path().join("escape").exists());
    // A file standing where a later entry wants a directory.
    let tar = raw_tar(&[("d", T::Regular, b"x", ""), ("d/f", T::Regular, b"y", "")]);
    let (_tmp, got) = unpack_bytes(&tar, 1 << 20);
    assert!(got.expect_err("a file as a parent").to_string().contains("not a directory"));
}

#[test]
fn unpacking_is_bounded_in_bytes_and_entries() {
    use tar::EntryType as T;
    let big = vec![0u8; 5000];
    let tar = raw_tar(&[("a", T::Regular, &big, ""), ("b", T::Regular, &big, "")]);
    let (_tmp, got) = unpack_bytes(&tar, 8000);
    assert!(matches!(got, Err(ArchiveError::OverBound { max: 8000 })), "{got:?}");
    let (_tmp, got) = unpack_bytes(&tar, 10_000);
    assert_eq!(got.expect("within"), Unpacked { entries: 2, bytes: 10_000 });
    // Not a tar at all.
    let (_tmp, got) = unpack_bytes(&[1u8; 700], 1 << 20);
    assert!(got.is_err());
}
