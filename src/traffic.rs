//! What the measuring harnesses (`bench`, `crash`, `overload`) share to make and read traffic:
//! input files written or linked into the storage's data directory, dCache `transfer` messages
//! as a pool publishes them, the scheduler's job gauges read back, a process's CPU time,
//! percentiles.
//!
//! Must not know: the stack, its processes, commands.

use anyhow::Context as _;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nearest-rank percentile (`q` in 0..=1) of `v` (sorted in place); 0 for an empty slice.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Writes `size` bytes of a pattern seeded by `seed` at `data_dir` + `path`.
pub fn write_input(data_dir: &Path, path: &str, size: usize, seed: u64) -> anyhow::Result<()> {
    let file = place(data_dir, path)?;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let bytes: Vec<u8> = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&file, bytes).with_context(|| format!("write {}", file.display()))
}

/// Puts an input of `size` bytes at `data_dir` + `path`: a new name hard-linked to the one file
/// of that size under `templates` (written by the first call for that size).
///
/// A landing file is written by a dCache pool, not by the hosts htfaas runs on; a harness
/// stands in for that pool on the same cores. A file created per event cost that stand-in more
/// CPU than the storage's whole part of the path: on a file system that searches past recently
/// freed inodes to allocate one (ext4 without a journal, as on the bench machine, after a run
/// that deleted thousands of files), creating the file was 85 % of the publisher's samples. A
/// link allocates no inode. Each event still names a file of its own, which the storage opens
/// and serves as any other.
pub fn link_input(data_dir: &Path, templates: &Path, path: &str, size: usize) -> anyhow::Result<()> {
    let name = format!("{size}.dat");
    let template = templates.join(&name);
    if !template.exists() {
        write_input(templates, &name, size, size as u64)?;
    }
    let file = place(data_dir, path)?;
    std::fs::hard_link(&template, &file).with_context(|| format!("link {}", file.display()))
}

/// `data_dir` + `path`, its parent directories made.
fn place(data_dir: &Path, path: &str) -> anyhow::Result<std::path::PathBuf> {
    let file = data_dir.join(path.trim_start_matches('/'));
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    Ok(file)
}

/// A pool's successful `transfer` write of `path`, as dCache publishes it.
pub fn transfer_write(path: &str, size: usize, run_id: &str, n: u64) -> Vec<u8> {
    let pnfsid = format!("0000{run_id}{n:016X}");
    let now_ms = u64::try_from(unix_ns() / 1_000_000).unwrap_or(0);
    let body = serde_json::json!({
        "version": "1.0", "msgType": "transfer", "isWrite": "write", "isP2p": false,
        "status": {"code": 0, "msg": ""}, "cellName": "pool-bench", "cellType": "pool",
        "cellDomain": "poolBenchDomain",
        "session": format!("pool:pool-bench@poolBenchDomain:{now_ms}-{n}"),
        "initiator": format!("door:bench@benchDomain:{run_id}-{n}"),
        "transferPath": path, "billingPath": path, "pnfsid": pnfsid,
        "fileSize": size, "transferSize": size, "transferTime": 1,
        "subject": ["UserNamePrincipal[alice]", "Origin[127.0.0.1]"],
        "protocolInfo": {"protocol": "Http", "versionMajor": 1, "versionMinor": 1, "host": "127.0.0.1", "port": 0},
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Nanoseconds since the Unix epoch (0 before it).
pub fn unix_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// `htfaas_scheduler_jobs{state="X"} N` lines of a Prometheus text.
pub fn parse_job_states(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("htfaas_scheduler_jobs{state=\"")?;
            let (state, rest) = rest.split_once("\"}")?;
            let n = rest.trim().parse::<f64>().ok()?;
            Some((state.to_owned(), n as u64))
        })
        .collect()
}

/// The value of the unlabelled counter `name` (its `_total` sample) in a Prometheus text.
pub fn parse_counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix("_total ")?;
        Some(rest.trim().parse::<f64>().ok()? as u64)
    })
}

/// CPU time (user + system) of process `pid` so far (`/proc/<pid>/stat`), or `None` where
/// there is no procfs.
pub fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from its closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / USER_HZ))
}

/// Bytes process `pid` has written so far through `write(2)` and its kin, to files and sockets
/// alike (`wchar` of `/proc/<pid>/io`), or `None` where it cannot be read.
pub fn bytes_written(pid: &str) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("wchar:")?.trim().parse().ok())
}

/// Context switches of process `pid`'s live threads so far, voluntary and not (the sum over
/// `/proc/<pid>/task/*/status`), or `None` where it cannot be read. A thread that has ended
/// takes its count with it, so this is a lower bound; the runtimes' threads live for the run.
/// Each switch is a hand-off between threads (a wake-up, a wait), the cost a hop adds beyond
/// its work; steadier than CPU time on a shared machine.
pub fn context_switches(pid: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        total += switches_of(&status);
    }
    Some(total)
}

/// The voluntary and non-voluntary context switches of one `/proc/…/status` text.
fn switches_of(status: &str) -> u64 {
    status
        .lines()
        .filter_map(|l| {
            let (key, value) = l.split_once(':')?;
            key.ends_with("ctxt_switches").then(|| value.trim().parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// The unit of `/proc/<pid>/stat` times: `USER_HZ`, 100 per second in Linux's user ABI.
const USER_HZ: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;
    use htfaas_functions::proto::TransferMessage;

    #[test]
    fn context_switches_add_both_kinds_and_read_this_process() {
        let status = "Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\nVmRSS:\t9 kB\n";
        assert_eq!(switches_of(status), 15);
        assert_eq!(switches_of("Name:\tx\nvoluntary_ctxt_switches:\tmany\n"), 0, "a field that is no number counts 0");
        let before = context_switches("self").expect("this process's threads");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(context_switches("self").expect("again") > before, "a sleep switches out at least once");
        assert_eq!(context_switches("0"), None, "no process 0 in /proc");
    }

    #[test]
    fn a_counter_is_read_from_its_total_line_only() {
        let text = "# TYPE htfaas_scheduler_store_writes counter\n\
                    htfaas_scheduler_store_writes_total 1234\n\
                    htfaas_scheduler_store_write_batches_total 99\n";
        assert_eq!(parse_counter(text, "htfaas_scheduler_store_writes"), Some(1234));
        assert_eq!(parse_counter(text, "htfaas_scheduler_store_write_batches"), Some(99));
        assert_eq!(parse_counter(text, "htfaas_scheduler_store"), None);
    }

    #[test]
    fn job_states_come_from_the_gauge_lines_only() {
        let text = "# TYPE htfaas_scheduler_jobs gauge\n\
                    htfaas_scheduler_jobs{state=\"idle\"} 12\n\
                    htfaas_scheduler_jobs{state=\"completed\"} 3456\n\
                    htfaas_scheduler_jobs_other{state=\"idle\"} 99\n\
                    htfaas_scheduler_jobs{state=\"running\"} x\n";
        let s = parse_job_states(text);
        assert_eq!(s.get("idle"), Some(&12));
        assert_eq!(s.get("completed"), Some(&3456));
        assert_eq!(s.get("running"), None, "an unparsable value is no figure");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_transfer_message_parses_as_the_gateway_reads_it() {
        let bytes = transfer_write("/data/bench/sum/a.dat", 1024, "abcd", 7);
        let m: TransferMessage = serde_json::from_slice(&bytes).expect("parses");
        assert_eq!(m.transfer_path.as_deref(), Some("/data/bench/sum/a.dat"));
        assert_eq!(m.file_size, Some(1024));
        let other = transfer_write("/data/bench/sum/a.dat", 1024, "abcd", 8);
        let o: TransferMessage = serde_json::from_slice(&other).expect("parses");
        assert_ne!(m.pnfsid, o.pnfsid, "each event is a new file");
        let d = htfaas_functions::sources::dcache::decide(&bytes, "m1", &Default::default()).expect("decides");
        match d {
            htfaas_functions::sources::Decision::Fire(ev) => assert_eq!(ev.path, "/data/bench/sum/a.dat"),
            other => panic!("the gateway does not fire on it: {other:?}"),
        }
    }

    #[test]
    fn this_process_has_cpu_time() {
        let a = cpu_time("self").expect("procfs");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time("self").expect("procfs") >= a);
        assert!(cpu_time("no-such-pid").is_none());
    }

    #[test]
    fn inputs_are_deterministic_per_seed() {
        let dir = tempfile::tempdir().expect("tmp");
        write_input(dir.path(), "/a/b.dat", 100, 1).expect("write");
        write_input(dir.path(), "/a/c.dat", 100, 2).expect("write");
        let b = std::fs::read(dir.path().join("a/b.dat")).expect("read");
        let c = std::fs::read(dir.path().join("a/c.dat")).expect("read");
        assert_eq!(b.len(), 100);
        assert_ne!(b, c);
        write_input(dir.path(), "/a/d.dat", 100, 1).expect("write");
        assert_eq!(b, std::fs::read(dir.path().join("a/d.dat")).expect("read"));
    }
    #[test]
    fn linked_inputs_are_new_names_of_one_file_per_size() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("tmp");
        let (data, templates) = (dir.path().join("data"), dir.path().join("inputs"));
        link_input(&data, &templates, "/a/one.dat", 100).expect("link");
        link_input(&data, &templates, "/b/two.dat", 100).expect("link");
        link_input(&data, &templates, "/a/big.dat", 200).expect("link");
        let meta = |p: &str| std::fs::metadata(data.join(p)).expect("stat");
        assert_eq!(meta("a/one.dat").ino(), meta("b/two.dat").ino());
        assert_ne!(meta("a/one.dat").ino(), meta("a/big.dat").ino());
        assert_eq!((meta("a/one.dat").len(), meta("a/big.dat").len()), (100, 200));
        assert!(link_input(&data, &templates, "/a/one.dat", 100).is_err(), "a name is never reused");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut v, 1.0), 100.0);
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        let mut one = vec![7.0];
        assert_eq!(percentile(&mut one, 0.99), 7.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
