//! The image cache's rules, each against a tar built here; hostile names are written into the
//! headers' raw bytes, as an attacker would (the tar crate's builder refuses them).

use super::*;
use tar::EntryType;

/// A tar archive built entry by entry, names and link targets taken as raw bytes.
struct Tar(tar::Builder<Vec<u8>>);

fn header(kind: EntryType, path: &str, mode: u32, size: u64, link: &str) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    let old = h.as_old_mut();
    old.name[..path.len()].copy_from_slice(path.as_bytes());
    old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    h
}

impl Tar {
    fn new() -> Tar {
        Tar(tar::Builder::new(Vec::new()))
    }

    fn add(mut self, kind: EntryType, path: &str, mode: u32, data: &[u8], link: &str) -> Tar {
        let h = header(kind, path, mode, data.len() as u64, link);
        self.0.append(&h, data).expect("append to a Vec");
        self
    }

    fn file(self, path: &str, mode: u32, data: &[u8]) -> Tar {
        self.add(EntryType::Regular, path, mode, data, "")
    }

    fn dir(self, path: &str, mode: u32) -> Tar {
        self.add(EntryType::Directory, path, mode, b"", "")
    }

    fn symlink(self, path: &str, target: &str) -> Tar {
        self.add(EntryType::Symlink, path, 0o777, b"", target)
    }

    fn hard_link(self, path: &str, target: &str) -> Tar {
        self.add(EntryType::Link, path, 0o644, b"", target)
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("finish a Vec")
    }
}

/// A test's directories: the cache's, a place for tar files, and a "host" directory standing
/// for what an image must never reach.
struct Fixture {
    t: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let t = tempfile::tempdir().expect("tempdir");
        let f = Fixture { t };
        fs::create_dir_all(f.host()).expect("host dir");
        fs::write(f.host().join("passwd"), "original").expect("host file");
        f
    }

    fn cache_dir(&self) -> PathBuf {
        self.t.path().join("cache")
    }

    fn host(&self) -> PathBuf {
        self.t.path().join("host")
    }

    fn cache(&self, max_bytes: u64) -> ImageCache {
        ImageCache::open(self.cache_dir(), max_bytes, vec![self.t.path().join("site")]).expect("open")
    }

    /// Writes `bytes` as a tar file; its digest and path.
    fn tar(&self, bytes: &[u8]) -> (Digest, PathBuf) {
        let digest = Digest::of(bytes);
        let path = self.t.path().join(format!("{}.tar", digest.short()));
        fs::write(&path, bytes).expect("write tar");
        (digest, path)
    }

    /// The names in the cache directory.
    fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.cache_dir())
            .expect("cache dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Unpacks `bytes`, expecting a refusal; the cache must be left empty.
    fn refused(&self, bytes: Vec<u8>) -> ImageError {
        let cache = self.cache(u64::MAX);
        let (digest, tar) = self.tar(&bytes);
        let err = cache.unpack(&digest, &tar).expect_err("the image must be refused");
        assert!(self.listing().is_empty(), "left behind: {:?}", self.listing());
        assert!(cache.get(&digest).is_none());
        err
    }

    /// The host directory holds only its original file, unchanged.
    fn host_untouched(&self) {
        assert_eq!(fs::read_to_string(self.host().join("passwd")).expect("host file"), "original");
        let names: Vec<_> = fs::read_dir(self.host()).expect("host").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["passwd"]);
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("metadata").permissions().mode() & 0o7777
}

fn assert_unsafe(err: ImageError, want_entry: &str, reason_has: &str) {
    match &err {
        ImageError::Unsafe { entry, reason } if entry == want_entry && reason.contains(reason_has) => {}
        other => panic!("want Unsafe {{ {want_entry:?}, ..{reason_has:?}.. }}, got {other:?}"),
    }
}

/// A small image of the kind mmdebstrap makes: `./` names, a setuid and a setgid program, a
/// sticky `tmp`, an absolute and a relative link, a hard link.
fn good_image() -> Vec<u8> {
    Tar::new()
        .dir("./", 0o755)
        .dir("./usr/", 0o755)
        .dir("./usr/bin/", 0o755)
        .file("./usr/bin/tool", 0o4755, b"#!/bin/sh\necho hi\n")
        .file("./usr/bin/group-tool", 0o2755, b"binary")
        .file("./etc/motd", 0o644, b"hello")
        .dir("./tmp/", 0o1777)
        .dir("./usr/lib/", 0o755)
        .file("./usr/lib/ld.so", 0o755, b"loader")
        .symlink("./lib64", "/usr/lib")
        .symlink("./usr/bin/loader", "../lib/ld.so")
        .hard_link("./usr/bin/tool-again", "./usr/bin/tool")
        .bytes()
}

#[test]
fn a_good_image_unpacks_with_its_mount_points_and_no_setuid_bit() {
    let f = Fixture::new();
    let cache = f.cache(u64::MAX);
    let (digest, tar) = f.tar(&good_image());
    let root = cache.unpack(&digest, &tar).expect("unpack");
    let r = root.path();
    assert_eq!(r, f.cache_dir().join(digest.hex()));
    assert_eq!(fs::read(r.join("usr/bin/tool")).expect("tool"), b"#!/bin/sh\necho hi\n");
    assert_eq!(fs::read_to_string(r.join("etc/motd")).expect("motd"), "hello");
    assert_eq!(mode(&r.join("usr/bin/tool")), 0o755);
    assert_eq!(mode(&r.join("usr/bin/group-tool")), 0o755);
    assert_eq!(mode(&r.join("etc/motd")), 0o644);
    assert_eq!(mode(&r.join("tmp")), 0o777);
    assert_eq!(mode(r), 0o755);
    assert_eq!(fs::read_link(r.join("lib64")).expect("link"), Path::new("/usr/lib"));
    assert_eq!(fs::read(r.join("usr/bin/loader")).expect("relative link"), b"loader");
    let ino = |p: &str| fs::metadata(r.join(p)).expect("file").ino();
    assert_eq!(ino("usr/bin/tool"), ino("usr/bin/tool-again"));
    for point in MOUNT_POINTS {
        assert!(fs::symlink_metadata(r.join(point)).expect("mount point").is_dir(), "{point}");
    }
    assert_eq!(cache.cached_bytes(), 18 + 6 + 5 + 6);
    assert_eq!(cache.get(&digest).expect("cached").path(), r);
    assert_eq!(f.listing(), [digest.hex()]);
}

#[test]
fn a_gzipped_image_unpacks() {
    let f = Fixture::new();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&good_image()).expect("gzip");
    let (digest, tar) = f.tar(&gz.finish().expect("gzip"));
    let root = f.cache(u64::MAX).unpack(&digest, &tar).expect("unpack");
    assert_eq!(fs::read_to_string(root.path().join("etc/motd")).expect("motd"), "hello");
}

#[test]
fn a_path_with_dot_dot_is_refused_and_nothing_is_written_outside() {
    let f = Fixture::new();
    for name in ["../escape", "a/../../escape", "./../../escape"] {
        let err = f.refused(Tar::new().file("a/ok", 0o644, b"ok").file(name, 0o644, b"out").bytes());
        assert_unsafe(err, name, "`..`");
        assert!(!f.cache_dir().join("escape").exists() && !f.t.path().join("escape").exists());
    }
    let err = f.refused(Tar::new().file("../escape", 0o644, b"out").bytes());
    assert_eq!(err.to_string(), r#"image refused: entry "../escape": a path with `..`"#);
}

#[test]
fn an_absolute_path_is_refused() {
    let f = Fixture::new();
    let target = f.host().join("planted");
    let name = target.to_str().expect("utf-8 temp path");
    let err = f.refused(Tar::new().file(name, 0o644, b"planted").bytes());
    assert_unsafe(err, name, "absolute");
    f.host_untouched();
}

#[test]
fn a_symlink_climbing_out_of_the_root_is_refused() {
    let f = Fixture::new();
    for (name, target) in [("a/b", "../../.."), ("up", ".."), ("a/b/c", "../x/../../../etc")] {
        let err = f.refused(Tar::new().dir("a/", 0o755).symlink(name, target).bytes());
        assert_unsafe(err, name, "out of the image");
    }
}

#[test]
fn writing_through_a_symlink_is_refused_and_the_host_file_untouched() {
    let f = Fixture::new();
    let host = f.host();
    let host = host.to_str().expect("utf-8 temp path");
    // Through a link as the parent: a file, a directory, a file below a directory.
    for (second, kind) in
        [("a/passwd", EntryType::Regular), ("a/sub/", EntryType::Directory), ("a/sub/x", EntryType::Regular)]
    {
        let err = f.refused(Tar::new().symlink("a", host).add(kind, second, 0o644, b"pwned", "").bytes());
        assert_unsafe(err, second, "parent a is a symbolic link");
        f.host_untouched();
    }
    // Through a link as the entry itself: a second entry at the link's path.
    let passwd = format!("{host}/passwd");
    let err = f.refused(Tar::new().symlink("b", &passwd).file("b", 0o644, b"pwned").bytes());
    assert_unsafe(err, "b", "already taken");
    // A relative link inside the image, then a write through it, is refused the same way.
    let err = f.refused(Tar::new().dir("d/", 0o755).symlink("l", "d").file("l/x", 0o644, b"x").bytes());
    assert_unsafe(err, "l/x", "symbolic link");
    f.host_untouched();
}

#[test]
fn a_hard_link_to_anything_but_an_earlier_file_is_refused() {
    let f = Fixture::new();
    let passwd = f.host().join("passwd");
    let passwd = passwd.to_str().expect("utf-8 temp path");
    let cases = [
        Tar::new().hard_link("h", "../../host/passwd"),
        Tar::new().hard_link("h", passwd),
        Tar::new().hard_link("h", "later").file("later", 0o644, b"x"),
        Tar::new().symlink("s", passwd).hard_link("h", "s"),
        Tar::new().dir("d/", 0o755).hard_link("h", "d"),
    ];
    for tar in cases {
        let err = f.refused(tar.bytes());
        assert_unsafe(err, "h", "not an earlier file");
    }
    f.host_untouched();
    assert_eq!(fs::metadata(f.host().join("passwd")).expect("host file").nlink(), 1);
}

#[test]
fn device_nodes_and_fifos_are_skipped_and_counted() {
    let f = Fixture::new();
    let tar = Tar::new()
        .dir("dev/", 0o755)
        .add(EntryType::Char, "dev/null", 0o666, b"", "")
        .add(EntryType::Block, "dev/sda", 0o660, b"", "")
        .add(EntryType::Fifo, "pipe", 0o644, b"", "")
        .file("ok", 0o644, b"ok")
        .bytes();
    let root = f.t.path().join("root");
    fs::create_dir(&root).expect("root");
    let done = unpack_into(&root, &tar[..], Limits::default()).expect("unpack");
    assert_eq!(done, Unpacked { bytes: 2, entries: 5, skipped: 3 });
    for gone in ["dev/null", "dev/sda", "pipe"] {
        assert!(fs::symlink_metadata(root.join(gone)).is_err(), "{gone} was made");
    }
    let (digest, tar) = f.tar(&tar);
    assert!(f.cache(u64::MAX).unpack(&digest, &tar).is_ok());
}

#[test]
fn a_mount_point_that_is_not_a_directory_is_refused() {
    let f = Fixture::new();
    let err = f.refused(Tar::new().symlink("input", "/").bytes());
    assert_unsafe(err, "input", "mount point");
    let err = f.refused(Tar::new().file("tmp", 0o644, b"").bytes());
    assert_unsafe(err, "tmp", "mount point");
}

#[test]
fn a_second_entry_at_a_taken_path_is_refused_but_a_directory_again_is_not() {
    let f = Fixture::new();
    let err = f.refused(Tar::new().file("x", 0o644, b"1").file("x", 0o644, b"2").bytes());
    assert_unsafe(err, "x", "already taken");
    let err = f.refused(Tar::new().dir("x/", 0o755).file("x", 0o644, b"2").bytes());
    assert_unsafe(err, "x", "already taken");
    let (digest, tar) = f.tar(&Tar::new().file("d/f", 0o644, b"1").dir("d/", 0o750).dir("d/", 0o755).bytes());
    let root = f.cache(u64::MAX).unpack(&digest, &tar).expect("a directory twice");
    assert_eq!(mode(&root.path().join("d")), 0o755);
}

#[test]
fn a_digest_mismatch_is_refused_before_anything_is_unpacked() {
    let f = Fixture::new();
    let cache = f.cache(u64::MAX);
    let (actual, tar) = f.tar(&good_image());
    let expected = Digest::of(b"another image");
    match cache.unpack(&expected, &tar) {
        Err(ImageError::DigestMismatch { expected: e, actual: a }) => assert_eq!((e, a), (expected.clone(), actual)),
        other => panic!("want DigestMismatch, got {other:?}"),
    }
    assert!(f.listing().is_empty());
    assert!(cache.get(&expected).is_none());
}

/// 200 MiB of zeros gzip to a few hundred KiB: the image is refused at its limit.
#[test]
fn a_gzip_bomb_is_refused_and_its_temp_removed() {
    let f = Fixture::new();
    let limits = Limits { bytes: 16 << 20, ..Limits::default() };
    let bomb = |files: u64, each: u64| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        {
            let mut b = tar::Builder::new(&mut gz);
            for i in 0..files {
                let h = header(EntryType::Regular, &format!("zeros-{i}"), 0o644, each, "");
                b.append(&h, io::repeat(0).take(each)).expect("append");
            }
            b.finish().expect("finish");
        }
        gz.finish().expect("gzip")
    };
    // One huge file, and many files each under the limit.
    for (files, each) in [(1, 200 << 20), (50, 1 << 20)] {
        let bytes = bomb(files, each);
        assert!(bytes.len() < 1 << 20, "the bomb is {} bytes", bytes.len());
        let cache = ImageCache::open(f.cache_dir(), u64::MAX, vec![]).expect("open").with_limits(limits);
        let (digest, tar) = f.tar(&bytes);
        match cache.unpack(&digest, &tar) {
            Err(ImageError::TooLarge { what: "bytes unpacked", max }) => assert_eq!(max, 16 << 20),
            other => panic!("want TooLarge, got {other:?}"),
        }
        assert!(f.listing().is_empty(), "left behind: {:?}", f.listing());
        // What was written before the refusal stayed within the limit.
        let root = f.t.path().join(format!("root-{files}"));
        fs::create_dir(&root).expect("root");
        let stream = flate2::read::GzDecoder::new(&bytes[..]);
        assert!(matches!(unpack_into(&root, stream, limits), Err(ImageError::TooLarge { .. })));
        let written = tree_bytes(&root).expect("walk");
        assert!(written <= 16 << 20 && (files == 1 || written >= 15 << 20), "{written} bytes written");
    }
}

/// A GNU long name of 64 MiB would be read into memory whole by the tar reader.
#[test]
fn a_huge_header_is_refused_before_it_is_read_whole() {
    let f = Fixture::new();
    // As the first entry, and after one.
    for first in [false, true] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        {
            let mut b = tar::Builder::new(&mut gz);
            if first {
                let h = header(EntryType::Regular, "first", 0o644, 5, "");
                b.append(&h, &b"first"[..]).expect("append");
            }
            let h = header(EntryType::GNULongName, "././@LongLink", 0o644, 64 << 20, "");
            b.append(&h, io::repeat(b'a').take(64 << 20)).expect("append");
            let h = header(EntryType::Regular, "x", 0o644, 1, "");
            b.append(&h, &b"x"[..]).expect("append");
            b.finish().expect("finish");
        }
        let err = f.refused(gz.finish().expect("gzip"));
        assert!(matches!(err, ImageError::TooLarge { max: HEADER_BUDGET, .. }), "{err:?}");
    }
}

#[test]
fn too_many_entries_are_refused() {
    let f = Fixture::new();
    let mut tar = Tar::new();
    for i in 0..20 {
        tar = tar.dir(&format!("d{i}/"), 0o755);
    }
    let cache = f.cache(u64::MAX).with_limits(Limits { entries: 10, ..Limits::default() });
    let (digest, path) = f.tar(&tar.bytes());
    assert!(matches!(cache.unpack(&digest, &path), Err(ImageError::TooLarge { what: "entries", max: 10 })));
    assert!(f.listing().is_empty());
}

#[test]
fn not_a_tar_is_malformed() {
    let f = Fixture::new();
    let err = f.refused(vec![0x1f, 0x8b, 1, 2, 3]);
    assert!(matches!(err, ImageError::Malformed { .. }), "{err:?}");
    let err = f.refused(b"just text, not a tar header at all".repeat(40));
    assert!(matches!(err, ImageError::Malformed { .. }), "{err:?}");
}

/// An image of one 1000-byte file, distinct per `n`.
fn kilo_image(f: &Fixture, n: u8) -> (Digest, PathBuf) {
    f.tar(&Tar::new().file("data", 0o644, &[n; 1000]).bytes())
}

#[test]
fn eviction_keeps_a_pinned_image_and_removes_the_oldest_unpinned() {
    let f = Fixture::new();
    let cache = f.cache(2500);
    let (a, a_tar) = kilo_image(&f, 1);
    let (b, b_tar) = kilo_image(&f, 2);
    let (c, c_tar) = kilo_image(&f, 3);
    let (d, d_tar) = kilo_image(&f, 4);
    let pinned_a = cache.unpack(&a, &a_tar).expect("a");
    drop(cache.unpack(&b, &b_tar).expect("b"));
    // Three images exceed 2500 bytes: a is the oldest but pinned, so b goes.
    let pinned_c = cache.unpack(&c, &c_tar).expect("c");
    assert!(cache.get(&b).is_none());
    assert!(!f.cache_dir().join(b.hex()).exists());
    assert_eq!(fs::read(pinned_a.path().join("data")).expect("a stays"), [1; 1000]);
    assert_eq!(cache.cached_bytes(), 2000);
    // Unpinned, a is the oldest: it goes, c (pinned) stays.
    drop(pinned_a);
    drop(cache.unpack(&d, &d_tar).expect("d"));
    assert!(cache.get(&a).is_none());
    assert!(cache.get(&c).is_some() && cache.get(&d).is_some());
    let mut want = vec![c.hex().to_owned(), d.hex().to_owned()];
    want.sort();
    assert_eq!(f.listing(), want);
    drop(pinned_c);
}

#[test]
fn get_refreshes_the_last_use() {
    let f = Fixture::new();
    let cache = f.cache(2500);
    let (a, a_tar) = kilo_image(&f, 1);
    let (b, b_tar) = kilo_image(&f, 2);
    let (c, c_tar) = kilo_image(&f, 3);
    drop(cache.unpack(&a, &a_tar).expect("a"));
    drop(cache.unpack(&b, &b_tar).expect("b"));
    drop(cache.get(&a).expect("a"));
    drop(cache.unpack(&c, &c_tar).expect("c"));
    assert!(cache.get(&b).is_none(), "b was the least recently used");
    assert!(cache.get(&a).is_some());
}

#[test]
fn a_site_image_is_found_and_never_evicted() {
    let f = Fixture::new();
    let site_digest = Digest::of(b"site image");
    let site_root = f.t.path().join("site").join(site_digest.hex());
    fs::create_dir_all(site_root.join("usr")).expect("site root");
    fs::write(site_root.join("usr/big"), vec![0u8; 10_000]).expect("site file");
    // A site entry that is a file, not a directory, is no image.
    let not_dir = Digest::of(b"not a directory");
    fs::write(f.t.path().join("site").join(not_dir.hex()), "x").expect("site file");
    let cache = f.cache(1500);
    assert_eq!(cache.get(&site_digest).expect("site image").path(), site_root);
    assert!(cache.get(&not_dir).is_none());
    assert!(cache.get(&Digest::of(b"unknown")).is_none());
    for n in 1..=3 {
        let (d, tar) = kilo_image(&f, n);
        drop(cache.unpack(&d, &tar).expect("unpack"));
    }
    assert_eq!(cache.cached_bytes(), 1000, "the site's bytes are not the cache's");
    assert_eq!(fs::read(site_root.join("usr/big")).expect("site file stays").len(), 10_000);
    assert_eq!(cache.get(&site_digest).expect("still there").path(), site_root);
}

#[test]
fn open_removes_leftover_temps_and_indexes_what_is_there() {
    let f = Fixture::new();
    let d = Digest::of(b"unpacked before");
    let root = f.cache_dir().join(d.hex());
    fs::create_dir_all(&root).expect("root");
    fs::write(root.join("f"), vec![7u8; 1234]).expect("file");
    fs::hard_link(root.join("f"), root.join("f-again")).expect("hard link");
    let leftover = f.cache_dir().join(".tmp-0123456789abcdef");
    fs::create_dir_all(leftover.join("half/unpacked")).expect("leftover");
    fs::write(leftover.join("half/unpacked/file"), "x").expect("leftover file");
    fs::write(f.cache_dir().join(".tmp-file"), "x").expect("leftover file");
    fs::write(f.cache_dir().join("NOTES"), "not an image").expect("other file");
    let cache = f.cache(u64::MAX);
    let mut want = vec!["NOTES".to_owned(), d.hex().to_owned()];
    want.sort();
    assert_eq!(f.listing(), want);
    assert_eq!(cache.cached_bytes(), 1234);
    assert_eq!(cache.get(&d).expect("indexed").path(), root);
    drop(cache);
    // Reopened smaller than what it holds: the image goes.
    let cache = f.cache(1000);
    assert!(cache.get(&d).is_none());
    assert_eq!(f.listing(), ["NOTES"]);
}

/// Two unpacks of one image both got as far as their temporary directories: the second to
/// finish gets the first one's root, and its own temporary directory is gone.
#[test]
fn the_second_of_two_unpacks_of_one_image_keeps_the_first_root() {
    let f = Fixture::new();
    let cache = f.cache(u64::MAX);
    let (digest, tar) = f.tar(&good_image());
    let (tmp1, done1) = cache.unpack_to_temp(&digest, &tar).expect("first");
    let (tmp2, done2) = cache.unpack_to_temp(&digest, &tar).expect("second");
    assert_ne!(tmp1, tmp2);
    let first = cache.install(&digest, &tmp1, done1).expect("install first");
    let inode = fs::metadata(first.path().join("etc/motd")).expect("motd").ino();
    let second = cache.install(&digest, &tmp2, done2).expect("install second");
    assert_eq!(second.path(), first.path());
    assert_eq!(fs::metadata(second.path().join("etc/motd")).expect("motd").ino(), inode);
    assert_eq!(f.listing(), [digest.hex()]);
}

#[test]
fn concurrent_unpacks_of_one_image_are_harmless() {
    let f = Fixture::new();
    let cache = f.cache(u64::MAX);
    let (digest, tar) = f.tar(&good_image());
    let roots: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..4).map(|_| s.spawn(|| cache.unpack(&digest, &tar).map(|r| r.path().to_owned()))).collect();
        handles.into_iter().map(|h| h.join().expect("thread").expect("unpack")).collect()
    });
    assert!(roots.iter().all(|r| *r == f.cache_dir().join(digest.hex())), "{roots:?}");
    assert_eq!(f.listing(), [digest.hex()]);
    assert_eq!(fs::read_to_string(roots[0].join("etc/motd")).expect("motd"), "hello");
}

/// A real image (`HTFAAS_TEST_IMAGE_TAR=rootfs.tar`, made by mmdebstrap) unpacks whole.
#[test]
#[ignore = "needs a real image: HTFAAS_TEST_IMAGE_TAR=<mmdebstrap tar>"]
fn a_real_image_unpacks() {
    let tar = PathBuf::from(std::env::var_os("HTFAAS_TEST_IMAGE_TAR").expect("HTFAAS_TEST_IMAGE_TAR"));
    let f = Fixture::new();
    let digest = hash(&mut fs::File::open(&tar).expect("open")).expect("hash");
    let root = f.cache(u64::MAX).unpack(&digest, &tar).expect("unpack");
    let r = root.path();
    assert!(fs::symlink_metadata(r.join("usr/bin/sh")).is_ok());
    assert!(fs::read_link(r.join("usr/lib64/ld-linux-x86-64.so.2")).expect("loader link").is_absolute());
    assert_eq!(mode(&r.join("usr/bin/su")) & 0o7000, 0);
}
