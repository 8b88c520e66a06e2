//! htfaas hostile guest: does one bad thing, chosen by its first argument (after the input path), so the EP's tests can
//! show each limit holding for both guest kinds (WASI preview 1 module, preview 2 component).
//!
//! Modes: `spin` (endless loop), `alloc MB` (keeps allocating and touching memory),
//! `recurse` (unbounded recursion), `stdout MB` (writes that much to stdout), `files N` (creates
//! N files in `/output`), `write MB` (one output file of that size), `exit N` (exits with N),
//! `clock` (prints the wall clock and a random number: both must be available), `sleep S` (creates
//! `/output/sleeping`, then one sleep of S seconds, then prints `slept`), `fds N` (opens its input N times and keeps every
//! handle open), `write-then-exit N` (writes `/output/partial.txt`, then exits with N: a failed
//! run that left an output), `stamp` (writes `/output/stamp.json` holding the wall clock and a
//! random number: an output that differs on every run, for `htfaas audit rerun`), `count N [every K]`
//! (counts to N, one a second, keeping its count in `/checkpoint/n`: see [`count`]), `ok`.

use std::io::Write as _;

fn main() {
    // An EP passes the input's guest path first (`/input/<name>`), then the registered arguments.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("/input/")).collect();
    let mode = args.first().map(String::as_str).unwrap_or("ok");
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    match mode {
        "spin" => spin(),
        "alloc" => alloc(n),
        "recurse" => println!("depth {}", recurse(0)),
        "stdout" => flood_stdout(n),
        "files" => files(n),
        "write" => write_big(n),
        "exit" => std::process::exit(i32::try_from(n).unwrap_or(1)),
        "clock" => clock(),
        "stamp" => {
            if let Err(e) = std::fs::write("/output/stamp.json", stamp()) {
                eprintln!("stamp: {e}");
                std::process::exit(1);
            }
        }
        "sleep" => {
            // The marker says "about to sleep" to a test watching the scratch directory.
            if let Err(e) = std::fs::write("/output/sleeping", b"") {
                eprintln!("marker: {e}");
            }
            std::thread::sleep(std::time::Duration::from_secs(n));
            println!("slept");
        }
        "fds" => open_many(n),
        "count" => {
            let every = match (args.get(2).map(String::as_str), args.get(3)) {
                (Some("every"), Some(k)) => k.parse().ok(),
                _ => None,
            };
            count(n, every);
        }
        "write-then-exit" => {
            if let Err(e) = std::fs::write("/output/partial.txt", b"half of a result\n") {
                eprintln!("partial: {e}");
            }
            std::process::exit(i32::try_from(n).unwrap_or(1));
        }
        _ => println!("ok"),
    }
}

fn spin() {
    let mut x: u64 = 1;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

fn alloc(mb: u64) {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for i in 0..mb {
        // Touch every page so the memory is really used.
        blocks.push(vec![(i % 251) as u8 + 1; 1 << 20]);
    }
    println!("allocated {} MiB", blocks.len());
}

// Endless on purpose: the EP's stack limit is what ends it. No address-taken locals, so the
// frames are wasm frames (not Rust's shadow stack in linear memory).
#[allow(unconditional_recursion)]
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    std::hint::black_box(recurse(std::hint::black_box(depth + 1))) + depth
}

fn flood_stdout(mb: u64) {
    let line = [b'x'; 1023];
    let mut out = std::io::stdout().lock();
    for _ in 0..mb * 1024 {
        if out.write_all(&line).and_then(|()| out.write_all(b"\n")).is_err() {
            break;
        }
    }
}

fn files(n: u64) {
    for i in 0..n {
        if let Err(e) = std::fs::write(format!("/output/f{i:06}.txt"), b"x") {
            eprintln!("file {i}: {e}");
            std::process::exit(2);
        }
    }
    println!("created {n} files");
}

fn write_big(mb: u64) {
    let chunk = vec![0x5au8; 1 << 20];
    let mut f = match std::fs::File::create("/output/big.bin") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("create: {e}");
            std::process::exit(2);
        }
    };
    for i in 0..mb {
        if let Err(e) = f.write_all(&chunk) {
            eprintln!("after {i} MiB: {e}");
            std::process::exit(2);
        }
    }
    println!("wrote {mb} MiB");
}

fn clock() {
    println!("{}", stamp());
}

/// The wall clock and a random number, as JSON.
fn stamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut seed = std::collections::hash_map::RandomState::new();
    let r = std::hash::BuildHasher::hash_one(&mut seed, 42u8);
    format!("{{\"unix_s\":{now},\"random\":{r}}}")
}

fn open_many(n: u64) {
    let Some(input) = std::env::args().nth(1).filter(|a| a.starts_with("/input/")) else {
        eprintln!("no input path");
        std::process::exit(2);
    };
    let mut open = Vec::new();
    for i in 0..n {
        match std::fs::File::open(&input) {
            Ok(f) => open.push(f),
            Err(e) => {
                eprintln!("open {i}: {e}");
                std::process::exit(2);
            }
        }
    }
    println!("{} files open", open.len());
}

/// The exit code by which `count` asks to be resumed from its checkpoint.
const CHECKPOINT_EXIT: i32 = 85;

/// Counts from the number in `/checkpoint/n` (0 if there is none) up to `to`, one a second,
/// keeping each count atomically (written to `/checkpoint/n.tmp`, then renamed over
/// `/checkpoint/n`), so that a run stopped at any moment leaves a whole count behind. With
/// `every` K, exits with [`CHECKPOINT_EXIT`] after each K-th count short of the end. At the end,
/// writes `/output/counted` = "N\n" and prints `counted`.
fn count(to: u64, every: Option<u64>) {
    let start: u64 = match std::fs::read_to_string("/checkpoint/n") {
        Ok(text) => text.trim().parse().unwrap_or_else(|e| {
            eprintln!("/checkpoint/n holds {text:?}: {e}");
            std::process::exit(2);
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            eprintln!("read /checkpoint/n: {e}");
            std::process::exit(2);
        }
    };
    println!("starting at {start}");
    for i in start..to {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let kept = std::fs::write("/checkpoint/n.tmp", format!("{}\n", i + 1))
            .and_then(|()| std::fs::rename("/checkpoint/n.tmp", "/checkpoint/n"));
        if let Err(e) = kept {
            eprintln!("keep the count {}: {e}", i + 1);
            std::process::exit(2);
        }
        if every.is_some_and(|k| k > 0 && (i + 1) % k == 0 && i + 1 < to) {
            println!("checkpointed at {}", i + 1);
            std::process::exit(CHECKPOINT_EXIT);
        }
    }
    if let Err(e) = std::fs::write("/output/counted", format!("{to}\n")) {
        eprintln!("write /output/counted: {e}");
        std::process::exit(2);
    }
    println!("counted");
}
