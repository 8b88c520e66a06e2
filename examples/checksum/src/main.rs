//! htfaas example function: checksums of the input file.
//!
//! Reads `/input/<name>` (its path is the first argument) in 64 KiB chunks, computes adler32
//! (as dCache records it) and sha256, and writes `/output/<name>.checksums.json`:
//! `{"file":"<name>","size":N,"adler32":"<8 hex>","sha256":"<64 hex>"}`.
//!
//! With `--set` after the input (a collecting function's run: its group's other files under
//! `/input/ref/`) it writes one list instead, `/output/<group directory's name>.sha256sums`:
//! a `sha256sum` line for the input (`<name>`) and for each file below `/input/ref/` (its
//! storage path without the leading `/`), sorted by name.
//!
//! With `HTFAAS_STAMP=1` in its environment (as `htfaas bench` registers it) it first prints
//! `start_unix_ns=<the wall clock in ns>` on stderr, so the bench can time an event to the
//! moment its function starts.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::process::ExitCode;

/// Adler-32 (RFC 1950), computed incrementally.
struct Adler32 {
    a: u32,
    b: u32,
}

impl Adler32 {
    const MOD: u32 = 65_521;
    /// Largest run of bytes before the sums must be reduced so they cannot overflow u32.
    const NMAX: usize = 5552;

    fn new() -> Self {
        Adler32 { a: 1, b: 0 }
    }

    fn update(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(Self::NMAX) {
            for &byte in chunk {
                self.a += u32::from(byte);
                self.b += self.a;
            }
            self.a %= Self::MOD;
            self.b %= Self::MOD;
        }
    }

    fn finish(&self) -> u32 {
        (self.b << 16) | self.a
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Size, adler32 and sha256 of the file at `path`, read in 64 KiB chunks.
fn sums(path: &str) -> Result<(u64, u32, String), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let mut adler = Adler32::new();
    let mut sha = Sha256::new();
    let mut size: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|e| format!("read {path}: {e}"))?;
        if n == 0 {
            break;
        }
        adler.update(&buf[..n]);
        sha.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, adler.finish(), hex(&sha.finalize())))
}

/// Every file below `dir`, as paths relative to `root`.
fn files_below(root: &str, dir: &str, out: &mut Vec<String>) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("list {dir}: {e}")),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("list {dir}: {e}"))?;
        let path = format!("{dir}/{}", entry.file_name().to_string_lossy());
        if entry.file_type().map_err(|e| format!("{path}: {e}"))?.is_dir() {
            files_below(root, &path, out)?;
        } else {
            out.push(path[root.len() + 1..].to_owned());
        }
    }
    Ok(())
}

/// `--set`: one `sha256sum` list of the input and the group's other files.
fn run_set(input: &str, name: &str) -> Result<(), String> {
    const REF: &str = "/input/ref";
    let mut members = Vec::new();
    files_below(REF, REF, &mut members)?;
    members.sort();
    let group = members.first().and_then(|m| m.rsplit('/').nth(1)).filter(|g| !g.is_empty()).unwrap_or(name).to_owned();
    let mut lines = vec![(name.to_owned(), sums(input)?.2)];
    for m in &members {
        lines.push((m.clone(), sums(&format!("{REF}/{m}"))?.2));
    }
    lines.sort();
    let text: String = lines.iter().map(|(path, sha)| format!("{sha}  {path}\n")).collect();
    let out = format!("/output/{group}.sha256sums");
    std::fs::write(&out, text).map_err(|e| format!("write {out}: {e}"))?;
    println!("checksum: {} file(s) of {group}", lines.len());
    Ok(())
}

fn run() -> Result<(), String> {
    let input = std::env::args().nth(1).ok_or("usage: checksum /input/<file> [--set]")?;
    let name = input.rsplit('/').next().filter(|n| !n.is_empty()).ok_or("input path has no file name")?;
    if std::env::args().nth(2).as_deref() == Some("--set") {
        return run_set(&input, name);
    }
    let (size, adler, sha) = sums(&input)?;
    let json = format!(
        "{{\"file\":\"{}\",\"size\":{size},\"adler32\":\"{:08x}\",\"sha256\":\"{}\"}}\n",
        name.replace('\\', "\\\\").replace('"', "\\\""),
        adler,
        sha
    );
    let out = format!("/output/{name}.checksums.json");
    let mut f = std::fs::File::create(&out).map_err(|e| format!("create {out}: {e}"))?;
    f.write_all(json.as_bytes()).map_err(|e| format!("write {out}: {e}"))?;
    println!("checksum: {name}: {size} bytes");
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var_os("HTFAAS_STAMP").is_some() {
        let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        eprintln!("start_unix_ns={ns}");
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checksum: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adler32_known_value() {
        let mut a = Adler32::new();
        a.update(b"Wikipedia");
        assert_eq!(a.finish(), 0x11E6_0398);
    }
}
