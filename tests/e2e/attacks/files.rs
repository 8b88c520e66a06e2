//! Secrets at rest: another user of the stack's machine can read nothing of a
//! fresh state directory — every directory of it 0700, every key, token and database file
//! (with SQLite's `-wal` and `-shm`) 0600 — and a reader of the scheduler's database finds no
//! macaroon it could use: each is sealed under a key kept in a file of its own.

use htfaas::stack::demo_manifest;
use htfaas_functions::proto::JobState;
use htfaas_tests::{start_stack, upload_checksum, wait_for};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn walk(dir: &Path, out: &mut Vec<(PathBuf, bool, u32)>) {
    for e in std::fs::read_dir(dir).expect("list") {
        let e = e.expect("entry");
        let meta = std::fs::symlink_metadata(e.path()).expect("stat");
        out.push((e.path(), meta.is_dir(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            walk(&e.path(), out);
        }
    }
}

/// Whether `name` is a file holding a key, a token, a secret or a database.
fn secret_file(name: &str) -> bool {
    [".pem", ".key", ".sqlite", ".sqlite-wal", ".sqlite-shm", "secret", "secrets.json", "stack.json", "users.json"]
        .iter()
        .any(|s| name.ends_with(s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_state_directory_is_the_stack_users_alone_and_stored_macaroons_are_sealed() {
    let (dir, stack) = start_stack().await;
    let client = stack.client().expect("client");
    let digest = upload_checksum(&client).await;
    client.register(&demo_manifest(digest)).await.expect("register");
    client.put_bytes(b"files at rest".to_vec(), "/data/raw/rest.dat").await.expect("upload");
    wait_for("the job to complete", Duration::from_secs(60), || async {
        client.jobs().await.ok()?.into_iter().find(|j| j.state == JobState::Completed)
    })
    .await;

    let root = dir.path();
    let mut entries =
        vec![(root.to_path_buf(), true, std::fs::metadata(root).expect("stat").permissions().mode() & 0o777)];
    walk(root, &mut entries);
    let data = root.join("storage/data");
    let nats = root.join("nats");
    let images = root.join("ep/images");
    let mut wrong = Vec::new();
    let mut secrets = 0;
    for (path, is_dir, mode) in &entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let rel = path.strip_prefix(root).unwrap_or(path).display().to_string();
        // What users upload keeps its modes, behind the 0700 storage directories; nats-server
        // makes its own files, behind the 0700 nats directory; unpacked images keep theirs,
        // behind the EP's 0700 image cache.
        let inside = |dir: &std::path::PathBuf| path.starts_with(dir) && path != dir;
        let ours = !inside(&data) && !inside(&nats) && !inside(&images);
        if *is_dir && ours && *mode != 0o700 {
            wrong.push(format!("directory {rel} is {mode:o}, not 700"));
        }
        if !*is_dir && ours && secret_file(&name) {
            secrets += 1;
            if *mode != 0o600 {
                wrong.push(format!("{rel} is {mode:o}, not 600"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for must in
        ["secrets.json", "storage/secret", "scheduler/jobs.sqlite", "scheduler/attach.pem", "gateway/submit.pem"]
    {
        assert!(root.join(must).exists(), "{must} is where the test looks for it");
    }
    assert!(secrets >= 10, "{secrets} secret files checked");

    // The scheduler's database: every stored macaroon sealed.
    let db = rusqlite::Connection::open_with_flags(
        root.join("scheduler/jobs.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the job store read-only");
    let (jobs, sealed): (i64, i64) = db
        .query_row(
            "SELECT COUNT(*), SUM(json_extract(request, '$.input.macaroon') LIKE 'sealed-v1:%' \
             AND json_extract(request, '$.output.macaroon') LIKE 'sealed-v1:%') FROM job_requests",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("read the stored requests");
    assert_eq!((jobs, sealed), (1, 1), "every stored macaroon sealed");
    stack.stop().await.expect("stop");
}
